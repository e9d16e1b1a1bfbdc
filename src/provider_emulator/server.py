"""The emulator's aiohttp application, and ``serve`` (one process, or N on one port).

Each provider family registers its own live routes (``<provider>/api.add_routes``); ``batch_routes``
adds the batch endpoints of all three (/v1/files, /v1/batches, /v1/messages/batches,
:batchGenerateContent, /v1beta/batches, Gemini's upload and download).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import multiprocessing
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from llm_kit.loops import run as run_on_best_loop
from provider_emulator import batch_routes, models_api
from provider_emulator.anthropic import api as anthropic_api
from provider_emulator.config import EmulatorConfig
from provider_emulator.family import json_response
from provider_emulator.gemini import api as gemini_api
from provider_emulator.openai import api as openai_api
from provider_emulator.state import EmulatorState

STATE: web.AppKey[EmulatorState] = web.AppKey("emulator_state", EmulatorState)
BACKLOG = 2048  # benchmarks open hundreds of connections at once
SHUTDOWN_TIMEOUT_S = 5.0

ReadyCallback = Callable[[int], None]


def create_app(config: EmulatorConfig | None = None) -> web.Application:
    """The application: the live and batch endpoints of all three providers, /_emulator/*."""
    state = EmulatorState(config or EmulatorConfig())
    # Request bodies of image-heavy prompts are far above aiohttp's 1 MiB default.
    app = web.Application(client_max_size=64 * 1024**2)
    app[STATE] = state
    openai = openai_api.OpenAIFamily(state)
    anthropic = anthropic_api.AnthropicFamily(state)
    gemini = gemini_api.GeminiFamily(state)
    openai_api.add_routes(app, openai)
    anthropic_api.add_routes(app, anthropic)
    gemini_actions = batch_routes.add_routes(app, openai, anthropic, gemini)
    gemini_api.add_routes(app, gemini, gemini_actions)
    models_api.add_routes(app, openai, anthropic)
    app.router.add_get("/_emulator/stats", _stats)
    app.router.add_get("/_emulator/requests", _requests)
    app.router.add_post("/_emulator/reset", _reset)

    async def on_shutdown(_: web.Application) -> None:
        state.stop()  # wake injected hangs so that shutdown does not wait for them

    async def on_cleanup(_: web.Application) -> None:
        await state.batches.close()  # stop the jobs' work, remove their files

    app.on_shutdown.append(on_shutdown)
    app.on_cleanup.append(on_cleanup)
    return app


async def _stats(request: web.Request) -> web.Response:
    return json_response(request.app[STATE].stats.snapshot())


async def _requests(request: web.Request) -> web.Response:
    """The live requests kept with ``record_requests`` (an empty list without it)."""
    return json_response(request.app[STATE].recorded or [])


async def _reset(request: web.Request) -> web.Response:
    request.app[STATE].reset_stats()
    return json_response({"ok": True})


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket (not yet listening); ``reuse_port`` lets N processes share the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


async def start_site(
    config: EmulatorConfig, sock: socket.socket
) -> tuple[web.AppRunner, EmulatorState]:
    """Serve ``create_app(config)`` on ``sock``; the caller owns ``runner.cleanup()``."""
    app = create_app(config)
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    )
    await runner.setup()
    await web.SockSite(runner, sock, backlog=BACKLOG).start()
    return runner, app[STATE]


async def _serve_until_signal(
    sock: socket.socket, config: EmulatorConfig, ready: ReadyCallback | None
) -> None:
    runner, _ = await start_site(config, sock)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if ready is not None:
            ready(sock.getsockname()[1])
        await stop.wait()
    finally:
        await runner.cleanup()


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed."""
    run_on_best_loop(main)


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    config: EmulatorConfig | None = None,
    *,
    ready: ReadyCallback | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down cleanly and return.

    ``ready(port)`` is called once every process listens (``port`` is the bound one, useful
    with ``port=0``). With ``config.workers > 1``, that many processes share the port through
    SO_REUSEPORT; each has its own rate limiter, fault stream and stats.
    """
    config = config or EmulatorConfig()
    if config.workers > 1:
        _serve_workers(host, port, config, ready)
        return
    _tune_gc()
    run_loop(_serve_until_signal(bind_socket(host, port), config, ready))


def _tune_gc() -> None:
    """Collect young objects less often: a batch body of 100,000 requests parses into a million
    small containers, and the default thresholds made parsing it about 4x slower."""
    gc.set_threshold(100_000, 50, 100)


def _worker(host: str, port: int, config: EmulatorConfig, ready: Any) -> None:
    # Drop the handlers inherited from the supervisor; the worker's loop installs its own.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    sock = bind_socket(host, port, reuse_port=True)
    _tune_gc()
    run_loop(_serve_until_signal(sock, config, lambda _: ready.put(True)))


def _serve_workers(
    host: str, port: int, config: EmulatorConfig, ready: ReadyCallback | None
) -> None:
    # Holding a bound, never-listening socket reserves the port (and resolves port=0) without
    # taking a share of the connections: the kernel only balances among listening sockets.
    reservation = bind_socket(host, port, reuse_port=True)
    port = reservation.getsockname()[1]
    context: Any = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    queue = context.Queue()
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    workers = [
        context.Process(target=_worker, args=(host, port, config, queue), daemon=True)
        for _ in range(config.workers)
    ]
    try:
        for process in workers:
            process.start()
        _wait_ready(queue, workers)
        reservation.close()
        if ready is not None:
            ready(port)
        while not stop.wait(0.2):
            if not all(p.is_alive() for p in workers):
                raise RuntimeError("an emulator worker process died")
    finally:
        for process in workers:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()  # SIGTERM: the worker shuts down cleanly
        for process in workers:
            process.join(SHUTDOWN_TIMEOUT_S + 5)
            if process.is_alive():
                process.kill()
        reservation.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_ready(ready: Any, workers: list[Any], timeout_s: float = 300.0) -> None:
    """Wait until every worker listens; fail fast when one dies (e.g. the model is missing).

    The generous timeout covers the local responder loading its model in every worker.
    """
    deadline = time.monotonic() + timeout_s
    count = 0
    while count < len(workers):
        try:
            ready.get(timeout=0.2)
            count += 1
        except queue.Empty:
            if not all(p.is_alive() for p in workers):
                raise RuntimeError(
                    "an emulator worker failed to start (see its error above)"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the emulator workers did not start within {timeout_s:.0f}s"
                ) from None
