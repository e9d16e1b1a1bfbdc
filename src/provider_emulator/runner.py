"""Start an emulator for a test or a benchmark and stop it afterwards.

- ``running_emulator(config)``: a background thread with its own event loop (fast start), or
  ``subprocess=True``: ``python -m provider_emulator`` in its own process, so that the server
  has its own core and GIL (benchmarks; needed for ``workers > 1``).
- ``async with emulator_in_loop(config)``: the server on the caller's running loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import re
import subprocess as sp
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from provider_emulator.config import EmulatorConfig
from provider_emulator.server import bind_socket, start_site

_READY = re.compile(r"http://\S+?:(\d+)")


def base_url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def ready_line(host: str, port: int) -> str:
    """What ``mmirage emulate`` and ``python -m provider_emulator`` print once they listen."""
    url = base_url(host, port)
    return f"Emulator ready: OpenAI {url}/v1  Anthropic {url}  Gemini {url}"


@dataclass(frozen=True)
class EmulatorHandle:
    """A running emulator: its addresses, and its counters (see ``Stats``)."""

    host: str
    port: int
    _stats: Callable[[], dict[str, Any]]
    _reset: Callable[[], None]
    _requests: Callable[[], list[dict[str, Any]]] = list

    @property
    def url(self) -> str:
        return base_url(self.host, self.port)

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    @property
    def gemini_base_url(self) -> str:
        return self.url

    def stats(self) -> dict[str, Any]:
        """Requests, answers per status, per family, and ``times`` when recorded.
        With several workers: the counters of whichever worker answers."""
        return self._stats()

    def reset_stats(self) -> None:
        """Zero the counters (and forget the recorded requests)."""
        self._reset()

    def requests(self) -> list[dict[str, Any]]:
        """The live requests received, oldest first, each ``{"family", "body", "messages"}``
        (``messages``: the conversation as the responder saw it, ``{"role", "content"}``);
        only with ``EmulatorConfig(record_requests=True)``, else empty."""
        return self._requests()


@contextlib.contextmanager
def running_emulator(
    config: EmulatorConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    subprocess: bool = False,
    startup_timeout_s: float = 30.0,
) -> Iterator[EmulatorHandle]:
    """An emulator on ``host:port`` (``0``: a free port) for the duration of the block."""
    config = config or EmulatorConfig()
    if subprocess:
        with _in_subprocess(config, host, port, startup_timeout_s) as handle:
            yield handle
        return
    if config.workers > 1:
        raise ValueError("an emulator with workers > 1 must run with subprocess=True")
    with _in_thread(config, host, port, startup_timeout_s) as handle:
        yield handle


@contextlib.contextmanager
def _in_thread(
    config: EmulatorConfig, host: str, port: int, timeout_s: float
) -> Iterator[EmulatorHandle]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="llm-kit-emulator", daemon=True)
    thread.start()

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)

    try:
        sock = bind_socket(host, port)
        try:
            runner, state = call(start_site(config, sock))
        except BaseException:
            sock.close()
            raise

        async def snapshot() -> dict[str, Any]:
            return state.stats.snapshot()

        async def reset() -> None:
            state.reset_stats()

        async def recorded() -> list[dict[str, Any]]:
            return list(state.recorded or [])

        try:
            yield EmulatorHandle(
                host,
                sock.getsockname()[1],
                lambda: call(snapshot()),
                lambda: call(reset()),
                lambda: call(recorded()),
            )
        finally:
            call(runner.cleanup())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        loop.close()


@contextlib.contextmanager
def _in_subprocess(
    config: EmulatorConfig, host: str, port: int, timeout_s: float
) -> Iterator[EmulatorHandle]:
    argv = [sys.executable, "-m", "provider_emulator", f"--host={host}", f"--port={port}"]
    process = sp.Popen([*argv, *config.to_argv()], stdout=sp.PIPE, text=True)
    try:
        bound = _read_port(process, timeout_s)
        url = base_url(host, bound)

        def stats() -> dict[str, Any]:
            with urllib.request.urlopen(url + "/_emulator/stats", timeout=timeout_s) as reply:
                data: dict[str, Any] = orjson.loads(reply.read())
                return data

        def recorded() -> list[dict[str, Any]]:
            with urllib.request.urlopen(url + "/_emulator/requests", timeout=timeout_s) as reply:
                data: list[dict[str, Any]] = orjson.loads(reply.read())
                return data

        def reset() -> None:
            request = urllib.request.Request(url + "/_emulator/reset", method="POST")
            urllib.request.urlopen(request, timeout=timeout_s).close()

        yield EmulatorHandle(host, bound, stats, reset, recorded)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout_s)
            except sp.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _read_port(process: sp.Popen[str], timeout_s: float) -> int:
    """The port from the child's ready line (read in a thread: pipes have no timeout)."""
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=timeout_s)
    except queue.Empty:
        raise RuntimeError(f"the emulator did not start within {timeout_s:.0f}s") from None
    match = _READY.search(line)
    if match is None:
        try:
            code: int | None = process.wait(5)
        except sp.TimeoutExpired:
            code = None
        raise RuntimeError(
            f"the emulator failed to start (exit code {code}; its stderr says why): "
            f"{line.strip()!r}"
        )
    return int(match.group(1))


@contextlib.asynccontextmanager
async def emulator_in_loop(
    config: EmulatorConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[EmulatorHandle]:
    """The emulator on the running event loop (pytest-asyncio tests); one process only."""
    config = config or EmulatorConfig()
    sock = bind_socket(host, port)
    try:
        runner, state = await start_site(config, sock)
    except BaseException:
        sock.close()
        raise
    try:
        yield EmulatorHandle(
            host,
            sock.getsockname()[1],
            state.stats.snapshot,
            state.reset_stats,
            lambda: list(state.recorded or []),
        )
    finally:
        await runner.cleanup()
