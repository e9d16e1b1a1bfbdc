"""Ctrl-C, SIGTERM and scancel pay nothing twice: a stopped run sends no new request, lets those
in flight come back (``stop_grace_seconds``), keeps their answers, and exits 130 (SIGINT) or 143
(SIGTERM); its rerun asks only for what nobody asked for before. A second signal stops at once.

Real processes and real signals against the emulator on 127.0.0.1, which counts every request it
is sent: "requests of the first run + those of the rerun == rows" is the promise. Counts and exit
codes only: no test measures how long anything took.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from provider_emulator import EmulatorConfig, running_emulator
from test_retry_cli import wait_for
from test_slurm import make_pipeline, rows_of, status

PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
ROWS = 48
CONCURRENCY = 8
KEY = "sk-graceful-stop-test"
NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM"}


@pytest.fixture(autouse=True)
def ctrl_c_not_ignored() -> Iterator[None]:
    """The processes under test must get Ctrl-C. A test run started as ``pytest ... &`` from a
    script ignores SIGINT, and so would they: Python (and mmirage) keep an inherited SIG_IGN."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # SIG_DFL after exec
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Process:
    """A process in its own process group (as a terminal runs a command), its stderr read as
    it comes, so a test can wait for a line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.err.append(line)
            self.lines.put(line)

    def signal_group(self, signum: int) -> None:
        """What a terminal's Ctrl-C does (to the foreground process group)."""
        os.killpg(self.proc.pid, signum)

    def wait_for_line(self, start: str, timeout: float = 60.0) -> str:
        while True:
            line = self.lines.get(timeout=timeout)
            if line.startswith(start):
                return line

    def end(self, timeout: float = 120.0) -> tuple[int, str]:
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(10)
        return code, "".join(self.err)


def mmirage_run(config: Path) -> Process:
    argv = [sys.executable, "-m", "mmirage", "run", str(config)]
    return Process(argv, {"OPENAI_API_KEY": KEY})


def pipeline(root: Path, base_url: str, *, shards: int = 1, **execution: Any) -> Path:
    local = {"mode": "local", **execution}
    return make_pipeline(
        root, base_url, shards=shards, rows=ROWS, concurrency=CONCURRENCY, execution=local
    )


def on_the_page(line: str) -> bool:
    """Whether docs/troubleshooting.md quotes ``line`` (each ``<placeholder>`` any text)."""
    quotes = re.findall(r"^`(.+)`$", PAGE.read_text(), flags=re.MULTILINE)
    patterns = [".+?".join(map(re.escape, re.split(r"<[a-z ]+>", q))) for q in quotes]
    return any(re.fullmatch(pattern, line.strip()) for pattern in patterns)


def in_flight(emu: Any) -> int:
    stats = emu.stats()
    return int(stats["requests"]) - sum(stats["status"].values())


def rerun_pays_the_rest(config: Path, emu: Any, root: Path) -> int:
    """Rerun to the end; every row there; the requests both runs sent."""
    rerun = subprocess.run(
        [sys.executable, "-m", "mmirage", "run", str(config)],
        env={**os.environ, "OPENAI_API_KEY": KEY},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert rerun.returncode == 0, rerun.stderr
    assert [row["id"] for row in rows_of(root)] == list(range(ROWS))
    return int(emu.stats()["requests"])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=NAMES.get)
def test_a_stopped_run_keeps_its_answers_in_flight(tmp_path: Path, signum: int) -> None:
    with running_emulator(EmulatorConfig(latency_s=0.5, latency_jitter_s=0.5)) as emu:
        config = pipeline(tmp_path, emu.openai_base_url)
        run = mmirage_run(config)
        wait_for(lambda: in_flight(emu) > 0, "requests in flight")
        run.signal_group(signum)
        code, err = run.end()
        assert code == 128 + signum, err
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"interrupted by {NAMES[signum]}: ") and "kept" in last, last
        assert on_the_page(last), last
        stopping = next(line for line in err.splitlines() if ": stopping; " in line)
        assert on_the_page(stopping), stopping
        first = emu.stats()
        assert 0 < first["requests"] < ROWS
        assert first["status"] == {"200": first["requests"]}  # each came back before the exit
        state = status(tmp_path, 0)
        assert state["status"] == "failed" and state["error"] == "interrupted"
        # The answers that came back during the stop were kept: nobody pays for a row twice.
        assert rerun_pays_the_rest(config, emu, tmp_path) == ROWS


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    """The drain would wait seconds for its answers: the second Ctrl-C abandons them, and the
    rerun asks for them again (more requests than rows, in all)."""
    with running_emulator(EmulatorConfig(latency_s=3.0)) as emu:
        config = pipeline(tmp_path, emu.openai_base_url)
        run = mmirage_run(config)
        wait_for(lambda: in_flight(emu) > 0, "requests in flight")
        run.signal_group(signal.SIGINT)
        run.wait_for_line("SIGINT: stopping; waiting up to 20 s")  # the drain began
        run.signal_group(signal.SIGINT)
        code, err = run.end()
        assert code == 128 + signal.SIGINT, err
        assert "a second signal stopped it at once" in err.strip().splitlines()[-1]
        assert status(tmp_path, 0)["error"] == "interrupted"
        assert rerun_pays_the_rest(config, emu, tmp_path) > ROWS


def test_no_grace_stops_at_once(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(latency_s=2.0)) as emu:
        config = pipeline(tmp_path, emu.openai_base_url, stop_grace_seconds=0)
        run = mmirage_run(config)
        wait_for(lambda: in_flight(emu) > 0, "requests in flight")
        run.proc.send_signal(signal.SIGTERM)  # kill, a job manager: to the process alone
        code, err = run.end()
        assert code == 128 + signal.SIGTERM, err
        assert "it stopped at once, without waiting" in err.strip().splitlines()[-1]
        assert rerun_pays_the_rest(config, emu, tmp_path) > ROWS  # the abandoned, again


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=NAMES.get)
def test_parallel_shards_drain_and_the_parent_exits_as_signalled(
    tmp_path: Path, signum: int
) -> None:
    """Ctrl-C reaches the parent and its children (one process group); a job manager's SIGTERM
    the parent alone, which passes the stop on. Either way each child drains."""
    with running_emulator(EmulatorConfig(latency_s=1.0, latency_jitter_s=0.5)) as emu:
        config = pipeline(tmp_path, emu.openai_base_url, shards=2, local_parallel_shards=2)
        parent = mmirage_run(config)
        wait_for(
            lambda: (
                all(status(tmp_path, k).get("status") == "running" for k in (0, 1))
                and in_flight(emu) > 0
            ),
            "both shards sending",
        )
        if signum == signal.SIGINT:
            parent.signal_group(signum)
        else:
            parent.proc.send_signal(signum)
        code, err = parent.end()
        assert code == 128 + signum, err
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"interrupted by {NAMES[signum]}: 2 shard(s) stopped"), err
        assert on_the_page(last), last
        first = emu.stats()
        assert first["status"] == {"200": first["requests"]}  # each came back before the exit
        for k in (0, 1):
            assert status(tmp_path, k)["error"] == "interrupted", err
        assert rerun_pays_the_rest(config, emu, tmp_path) == ROWS


BATCH_SCRIPT = """
import asyncio
import sys

from llm_kit import LLM, BatchConfig, BatchItem, Message


async def main() -> None:
    base_url, path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    llm = LLM("m", base_url=base_url, api_key="sk-test", config=BatchConfig(worker_concurrency=8))
    items = [BatchItem(f"item-{i}", [Message.user(f"say {i}")]) for i in range(count)]
    await llm.batch_to_jsonl(items, path, resume=True)


asyncio.run(main())
"""


def batch_to_jsonl(tmp_path: Path, emu: Any, count: int) -> Process:
    script = tmp_path / "batch.py"
    script.write_text(BATCH_SCRIPT)
    argv = [sys.executable, str(script), emu.openai_base_url, str(tmp_path / "out.jsonl")]
    return Process([*argv, str(count)], {})


def ids_written(tmp_path: Path) -> list[str]:
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    return [json.loads(line)["id"] for line in lines]


def test_batch_to_jsonl_keeps_the_answers_in_flight_at_ctrl_c(tmp_path: Path) -> None:
    count = 200
    with running_emulator(EmulatorConfig(latency_s=0.5, latency_jitter_s=0.5)) as emu:
        run = batch_to_jsonl(tmp_path, emu, count)
        wait_for(lambda: in_flight(emu) > 0, "requests in flight")
        run.signal_group(signal.SIGINT)
        code, err = run.end()
        assert code == -signal.SIGINT and "KeyboardInterrupt" in err, err  # raised, as usual
        paid = emu.stats()["requests"]
        assert 0 < paid < count
        assert len(ids_written(tmp_path)) == paid  # every answer paid for is in the file
        resumed = batch_to_jsonl(tmp_path, emu, count)
        code, err = resumed.end()
        assert code == 0, err
        assert emu.stats()["requests"] == count  # the resume asked only for the others
    assert sorted(ids_written(tmp_path)) == sorted(f"item-{i}" for i in range(count))


def test_batch_to_jsonl_stops_at_once_at_a_second_ctrl_c(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(latency_s=3.0)) as emu:
        run = batch_to_jsonl(tmp_path, emu, 200)
        wait_for(lambda: in_flight(emu) > 0, "requests in flight")
        run.signal_group(signal.SIGINT)
        run.wait_for_line("stopping: no new request")  # the first one is being held
        run.signal_group(signal.SIGINT)
        code, err = run.end()
        assert code == -signal.SIGINT and "KeyboardInterrupt" in err, err
        paid = emu.stats()["requests"]
        written = len(ids_written(tmp_path)) if (tmp_path / "out.jsonl").exists() else 0
        assert written < paid  # the answers still in flight were abandoned
