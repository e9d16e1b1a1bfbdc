"""Parallel local shards: up to ``local_parallel_shards`` child processes at a time, each
``mmirage run|retry CONFIG --shard-id K --run-id R``, their lines relayed with a ``[shard K]``
prefix. Stopping the parent (Ctrl-C, SIGTERM, even SIGKILL) stops the children, which record
"interrupted" and resume later from their checkpoints."""

from __future__ import annotations

import json
import logging
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

from mmirage.executors.console import Console
from mmirage.executors.forwarding import shard_env
from mmirage.executors.outcome import ShardOutcome
from mmirage.executors.signals import PARENT_PID_ENV

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

STOP_GRACE_S = 30.0  # how long stopped children get to record "interrupted" before SIGKILL


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
        config_path: Path,
        command: str,
        extra: list[str],
        width: int,
        run_id: str,
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path.resolve()
        self.command = command
        self.extra = extra
        self.width = width
        self.run_id = run_id
        self.env = shard_env(cfg)  # before any child starts: a provider it cannot import fails
        self.console = Console()
        self.started = time.monotonic()
        self.rows_before = 0
        self._shown_at = 0.0

    def run(self, shards: list[int]) -> list[ShardOutcome]:
        waiting = list(shards)
        running: dict[int, _Child] = {}
        outcomes: dict[int, ShardOutcome] = {}
        self.rows_before = self._rows(shards)
        stopped_by_user_error = False
        try:
            while waiting or running:
                while waiting and len(running) < self.width and not stopped_by_user_error:
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
        except BaseException as exc:  # Ctrl-C, SIGTERM: stop the children, then go
            self._stop(running.values(), signalled=isinstance(exc, KeyboardInterrupt))
            raise
        finally:
            self.console.close()
        for k in waiting:
            outcomes[k] = ShardOutcome(k, problem="not started (stopped on a configuration error)")
        return [outcomes[k] for k in shards]

    def _argv(self, shard_id: int) -> list[str]:
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        # One run id for all the children: batch receipts of this run share it.
        return [
            sys.executable, "-m", "mmirage", "--log-level", level, self.command,
            str(self.config_path), "--shard-id", str(shard_id), "--run-id", self.run_id,
            "--stats", *self.extra,
        ]  # fmt: skip

    def _spawn(self, shard_id: int) -> _Child:
        env = {**os.environ, **self.env, PARENT_PID_ENV: str(os.getpid())}
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
        why = "stopped by a signal" if code < 0 else f"exit code {code}, see its lines above"
        return ShardOutcome(child.shard_id, stats=stats, problem=why, user_error=code == 2)

    def _rows(self, shards: list[int]) -> int:
        from mmirage.core.shard.state import read_status, status_path

        return sum(
            int((read_status(status_path(self.cfg, k)) or {}).get("rows_done") or 0) for k in shards
        )

    def _show(
        self, shards: list[int], outcomes: Mapping[int, ShardOutcome], running: Mapping[int, Any]
    ) -> None:
        # Once a second: it reads every shard's status.json.
        if not self.console.live or time.monotonic() - self._shown_at < 1.0:
            return
        self._shown_at = time.monotonic()
        ok = sum(o.ok for o in outcomes.values())
        rows = self._rows(shards)
        rate = max(0, rows - self.rows_before) / max(time.monotonic() - self.started, 1e-9)
        self.console.status(
            f"shards: {ok} done, {len(outcomes) - ok} failed, {len(running)} running, "
            f"{len(shards) - len(outcomes) - len(running)} waiting | {rows} rows, "
            f"{rate:.1f} rows/s"
        )

    @staticmethod
    def _stop(children: Iterable[_Child], *, signalled: bool) -> None:
        """Ctrl-C already reached the children (same process group): give them time to record
        "interrupted". Otherwise send SIGTERM. SIGKILL whoever is still there after the grace."""
        live = [c for c in children if c.proc.poll() is None]
        if not signalled:
            for child in live:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in live:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


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
