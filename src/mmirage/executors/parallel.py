"""Parallel local shards: up to ``local_parallel_shards`` child processes at a time, each
``mmirage run|retry CONFIG --shard-id K --run-id R``, their lines relayed with a ``[shard K]``
prefix.

Stopping the parent (Ctrl-C, SIGTERM, even SIGKILL) stops the children gracefully: the parent
starts no more of them and tells the running ones to stop (``signals.PARENT_STOP``, not its own
signal, which they may get too: two would be a second signal). Each lets its requests in flight
come back for up to ``stop_grace_seconds``, records "interrupted" and resumes later from its
checkpoint; the parent then exits 130 (Ctrl-C) or 143 (SIGTERM), 0 only when every shard
finished anyway. A second signal stops the children at once (``signals.PARENT_HURRY``)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from mmirage.core.process.batch.cost import STALE_SAID_ENV, say_stale_prices
from mmirage.core.shard.progress import PROGRESS_ENV, RECORDS, stamped
from mmirage.executors.console import Console
from mmirage.executors.forwarding import shard_env
from mmirage.executors.live_total import LiveTotal
from mmirage.executors.outcome import ShardOutcome
from mmirage.executors.signals import (
    PARENT_HURRY,
    PARENT_PID_ENV,
    PARENT_STOP,
    STOP_SIGNALS,
    ignored,
)

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.rundir import RunDir

# How long stopped children get, past their drain, to record "interrupted" (closing their
# processors: a launched server takes seconds) before SIGKILL.
STOP_GRACE_S = 30.0


@dataclass
class _Child:
    shard_id: int
    proc: subprocess.Popen[bytes]
    stdout: list[bytes] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)


class ParallelRun:
    """Up to ``width`` child shard processes at a time; their outcomes, in shard order."""

    def __init__(
        self,
        cfg: MMirageConfig,
        run_dir: RunDir,
        config_path: Path,
        command: str,
        extra: list[str],
        width: int,
        run_id: str,
        *,
        handle_signals: bool = True,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.handle_signals = handle_signals  # False: an embedding program's handlers stay
        self.config_path = config_path.resolve()
        self.command = command
        self.extra = extra
        self.width = width
        self.run_id = run_id
        self.env = shard_env(cfg)  # before any child starts: a provider it cannot import fails
        self.console = Console()
        self.live = LiveTotal({})
        # A terminal's status line from the first second; a log's line every interval.
        self._shown_at = -math.inf if self.console.live else time.monotonic()

    def run(self, shards: list[int]) -> list[ShardOutcome]:
        """Every shard's outcome, in order; ``SystemExit`` (130, 143) when a signal stopped the
        run before every shard finished."""
        waiting = list(shards)
        running: dict[int, _Child] = {}
        outcomes: dict[int, ShardOutcome] = {}
        self.live = LiveTotal(self._before(shards))
        self.live.count_rows(self.cfg, shards)
        say_stale_prices(self.cfg)  # here, once: the children are told not to (``_spawn``)
        stopped_by_user_error = False
        # The handlers only note the signals: this loop acts on them between its steps, never
        # in the middle of a spawn or of reaping a child (whose exit status would be lost).
        with _NotedSignals(self.handle_signals) as signals:
            stop = _Stop(self.cfg.execution_params.stop_grace_seconds)
            try:
                while (waiting and not signals.received) or running:
                    stop.follow(signals.received, running.values())
                    while (
                        waiting
                        and len(running) < self.width
                        and not stopped_by_user_error
                        and not signals.received
                    ):
                        k = waiting.pop(0)
                        running[k] = self._spawn(k)
                    for k, child in list(running.items()):
                        if child.proc.poll() is not None:
                            outcomes[k] = self._outcome(running.pop(k))
                            stopped_by_user_error |= outcomes[k].user_error
                    if stopped_by_user_error and not running:
                        break
                    self._show(shards, outcomes, running)
                    time.sleep(0.2)
            except BaseException:  # a failure here: the children must not outlive the parent
                stop.follow([signal.SIGTERM], running.values())
                stop.wait(running.values())
                raise
            finally:
                self.console.close()
        why = "interrupted" if signals.received else "stopped on a configuration error"
        for k in waiting:
            outcomes[k] = ShardOutcome(k, problem=f"not started ({why})")
        ordered = [outcomes[k] for k in shards]
        if signals.received and not all(o.ok for o in ordered):
            raise SystemExit(_interrupted(signals.received[0], ordered))
        return ordered

    def _argv(self, shard_id: int) -> list[str]:
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        # One run id for all the children: batch receipts of this run share it. -P: a
        # module in the working directory (a stray click.py) must not shadow the installed ones.
        return [
            sys.executable, "-P", "-m", "mmirage", "--log-level", level, self.command,
            str(self.config_path), "--shard-id", str(shard_id), "--run-id", self.run_id,
            "--stats", *self.extra,
        ]  # fmt: skip

    def _spawn(self, shard_id: int) -> _Child:
        # RECORDS: the child writes its counts for the total line, not a progress line.
        env = {
            **os.environ,
            **self.env,
            PARENT_PID_ENV: str(os.getpid()),
            PROGRESS_ENV: RECORDS,
            STALE_SAID_ENV: "1",
        }
        proc = subprocess.Popen(
            self._argv(shard_id), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        child = _Child(shard_id, proc)
        assert proc.stdout is not None and proc.stderr is not None
        child.readers = [
            threading.Thread(target=self._relay, args=(shard_id, proc.stderr), daemon=True),
            threading.Thread(target=self._collect, args=(proc.stdout, child.stdout), daemon=True),
        ]
        for reader in child.readers:
            reader.start()
        return child

    def _relay(self, shard_id: int, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not self.live.take(shard_id, text):
                self.console.line(f"[shard {shard_id}] {text}")

    @staticmethod
    def _collect(stream: IO[bytes], into: list[bytes]) -> None:
        into.append(stream.read())

    def _outcome(self, child: _Child) -> ShardOutcome:
        for reader in child.readers:
            reader.join()
        code = child.proc.returncode
        stats = _child_stats(b"".join(child.stdout))
        if code == 0:
            return ShardOutcome(child.shard_id, ok=True, stats=stats)
        if code < 0:
            why = "stopped by a signal"
        elif code in _STOPPED:
            why = "interrupted, see its lines above"
        else:
            why = f"exit code {code}, see its lines above"
        return ShardOutcome(child.shard_id, stats=stats, problem=why, user_error=code == 2)

    def _before(self, shards: list[int]) -> dict[int, tuple[int, int]]:
        """Each shard's (rows done, rows failed) in its status.json, as the run begins."""
        from mmirage.core.shard.state import read_status

        before = {}
        for k in shards:
            status = read_status(self.run_dir.status_path(k)) or {}
            before[k] = (int(status.get("rows_done") or 0), int(status.get("rows_failed") or 0))
        return before

    def _show(
        self, shards: list[int], outcomes: Mapping[int, ShardOutcome], running: Mapping[int, Any]
    ) -> None:
        """The total line: a terminal's status line, once a second; in a log, one line every
        ``progress_interval_seconds``."""
        every = 1.0 if self.console.live else self.cfg.execution_params.progress_interval_seconds
        if time.monotonic() - self._shown_at < every:
            return
        self._shown_at = time.monotonic()
        ok = sum(o.ok for o in outcomes.values())
        waiting = len(shards) - len(outcomes) - len(running)
        text = (
            f"total: {self.live.line()} | shards: {ok} done, {len(outcomes) - ok} failed, "
            f"{len(running)} running, {waiting} waiting"
        )
        if self.console.live:
            self.console.status(text)
        else:
            self.console.line(stamped(text))


# The exit statuses of a child stopped by a signal it handled (SIGINT, SIGTERM, PARENT_STOP).
_STOPPED = (128 + signal.SIGINT, 128 + signal.SIGTERM)


class _NotedSignals:
    """While inside: SIGINT and SIGTERM are only noted, in order (``received``); one this
    process ignores stays ignored."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _NotedSignals:
        # signal() works in the main thread only; elsewhere (and when not enabled) a stop
        # reaches the run as an exception, and the children are stopped all the same.
        if self.enabled and threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if not ignored(signum):
                    self._previous[signum] = signal.signal(signum, self._note)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _note(self, signum: int, frame: object) -> None:
        self.received.append(signum)


class _Stop:
    """The parent's side of a stop: the first signal asks the children to stop gracefully,
    a second to stop at once; whoever is still there past the grace is killed."""

    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.told = 0  # signals passed on to the children
        self.deadline: float | None = None

    def follow(self, received: list[int], children: Iterable[_Child]) -> None:
        """Pass new signals on to ``children``; SIGKILL them once the grace is over."""
        live = [c for c in children if c.proc.poll() is None]
        if len(received) > self.told:
            first = self.told == 0
            for child in live:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(PARENT_STOP if first else PARENT_HURRY)
            grace = STOP_GRACE_S + (self.drain_s if first else 0.0)
            self.deadline = min(self.deadline or math.inf, time.monotonic() + grace)
            self.told = len(received)
        if self.deadline is not None and time.monotonic() > self.deadline:
            for child in live:
                child.proc.kill()

    def wait(self, children: Iterable[_Child]) -> None:
        """Until every child has ended, killing those still there past the deadline."""
        for child in children:
            left = (self.deadline or time.monotonic()) - time.monotonic()
            try:
                child.proc.wait(timeout=max(0.0, left))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


def _interrupted(signum: int, outcomes: list[ShardOutcome]) -> int:
    """Say how the stopped run ended (each stopped shard said what it kept); its exit status."""
    from mmirage.core.shard.stop import say, signal_name

    done = sum(o.ok for o in outcomes)
    unstarted = sum(bool(o.problem and o.problem.startswith("not started")) for o in outcomes)
    stopped = len(outcomes) - done - unstarted
    say(
        f"interrupted by {signal_name(signum)}: {stopped} shard(s) stopped (each said above "
        f"what it kept), {done} finished, {unstarted} not started; run the same command again "
        "to go on"
    )
    return 128 + signum


def _child_stats(output: bytes) -> dict[str, Any] | None:
    """The shard's report from a child's ``--stats`` JSON (``retry`` nests it under stats)."""
    try:
        doc = json.loads(output)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    per_shard = (doc.get("stats") or doc).get("per_shard") or []
    return per_shard[0] if per_shard and isinstance(per_shard[0], dict) else None
