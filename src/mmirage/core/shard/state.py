"""Shard state: ``<state_dir>/<pipeline id>/shard_<k>/status.json``, written atomically.

The shape is reference §3.9's (kept so existing tools read it) plus a ``heartbeat`` refreshed
while the shard runs (a ``running`` shard whose heartbeat is old, or whose local pid is gone, is
``stale``: dead, and may be retried), counters (``rows_done``, ``rows_failed``, tokens),
``attempts`` (every start; ``retry_count`` is kept for those tools and counts real retries,
``attempts - 1``), and a ``fingerprint`` of what decides the rows (``mmirage.rundir``) so a
changed config is never mixed into old results.

Counters are kept consistent across attempts: ``start`` sets them to what the checkpoints hold
(not to what a killed attempt last wrote), the runner advances them per checkpoint, and
``finish`` derives ``stats.rows_processed`` (rows this attempt added) and the throughput from
them, so no resume, crash or forced rerun can make them negative.

Paths, the pipeline id and the fingerprint are the run directory's contract (``mmirage.rundir``);
they are re-exported here for the callers that still import them from this module.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.core.shard.disk import writing
from mmirage.core.shard.remote_output import shard_output
from mmirage.errors import WorkFailed
from mmirage.rundir import COUNTERS, RunDir, atomic_write_json, now_iso, parse_iso

# Re-exported: the CLI and the executors import them from here.
from mmirage.usable_dirs import UnusableDirError as UnusableDirError
from mmirage.usable_dirs import ensure_writable_dir as ensure_writable_dir
from mmirage.usable_dirs import is_path_problem as is_path_problem
from mmirage.usable_dirs import unusable_dir as unusable_dir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

STALE_AFTER_S = 300.0  # a heartbeat older than this means the shard's process is gone
HEARTBEAT_EVERY_S = 30.0

# What ``shard_state`` answers (the status file's own ``status`` is running/success/failed).
SUCCESS, RUNNING, FAILED, STALE, EXHAUSTED, MISSING, UNKNOWN = (
    "success",
    "running",
    "failed",
    "stale",
    "exhausted",
    "missing",
    "unknown",
)


class ShardConflictError(WorkFailed):
    """The shard cannot run as asked (another live process holds it, or the config changed
    since its results were written); ``str(err)`` says what to do."""


def read_status(path: Path) -> dict[str, Any] | None:
    """The status dict; ``None`` when missing; ``{"status": "unknown"}`` when unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"status": UNKNOWN}
    return data if isinstance(data, dict) else {"status": UNKNOWN}


def _pid_dead(status: Mapping[str, Any]) -> bool:
    # Only decidable for a process on this host; elsewhere the heartbeat decides.
    pid = status.get("pid")
    if status.get("hostname") != socket.gethostname() or not isinstance(pid, int):
        return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def is_stale(status: Mapping[str, Any], stale_after_s: float = STALE_AFTER_S) -> bool:
    """A ``running`` shard that nobody runs any more."""
    if status.get("status") != RUNNING:
        return False
    beat = parse_iso(status.get("heartbeat") or status.get("started_at"))
    return beat is None or time.time() - beat > stale_after_s or _pid_dead(status)


def shard_state(
    status: Mapping[str, Any] | None, max_retries: int, stale_after_s: float = STALE_AFTER_S
) -> str:
    """success, running, stale, failed, exhausted (failed with no retry left), missing, unknown."""
    if status is None:
        return MISSING
    state = status.get("status")
    if state == RUNNING and is_stale(status, stale_after_s):
        state = STALE
    if state in (FAILED, STALE) and int(status.get("attempts") or 0) > max_retries:
        return EXHAUSTED  # exactly max_retries retries after the first attempt
    return state if state in (SUCCESS, RUNNING, FAILED, STALE) else UNKNOWN


class ShardStatus:
    """The status file of one shard, as one run updates it."""

    def __init__(self, config: MMirageConfig, run_dir: RunDir, shard_id: int) -> None:
        self.path = run_dir.status_path(shard_id)
        self.data: dict[str, Any] = read_status(self.path) or {}
        self._config = config
        self._shard_id = shard_id
        self._last_beat = 0.0
        self._baseline: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    @property
    def state(self) -> str:
        return shard_state(
            self.data or None, self._config.execution_params.max_retries, STALE_AFTER_S
        )

    def start(self, fp: str) -> None:
        """Record a new attempt, its counters starting at what the checkpoints hold."""
        lp = self._config.loading_params
        attempts = int(self.data.get("attempts") or 0) + 1
        self._baseline = checkpointed_counters(self._config, self._shard_id, fp)
        self.data.update(self._baseline)
        self.data.update(
            {
                "status": RUNNING,
                "shard_id": self._shard_id,
                "num_shards": lp.num_shards,
                "datasets": [
                    {"output_dir": d.output_dir, "image_base_path": d.image_base_path}
                    for d in lp.datasets
                ],
                "fingerprint": fp,
                "attempts": attempts,
                "retry_count": attempts - 1,
                "error": None,
                "started_at": now_iso(),
                "finished_at": None,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
            }
        )
        self.beat(force=True)

    def update_counters(self, counters: Mapping[str, int]) -> None:
        self.data.update(counters)

    def beat(self, *, force: bool = False) -> None:
        """Refresh the heartbeat (rewrites the file at most every few seconds unless forced)."""
        if not force and time.monotonic() - self._last_beat < 2.0:
            return
        self._last_beat = time.monotonic()
        self.data["heartbeat"] = now_iso()
        with writing(self.path, "loading_params.state_dir"):
            atomic_write_json(self.path, self.data)

    def finish(self, error: str | None, stats: Mapping[str, Any]) -> None:
        """Record the attempt's end. ``stats`` gives at least ``runtime_seconds``; the counters
        and ``rows_processed`` come from this status (what was checkpointed), not from the
        caller, whose view may miss the dataset that was in flight when it failed."""
        self.data.update(
            {
                "status": FAILED if error else SUCCESS,
                "error": error,
                "finished_at": now_iso(),
                "heartbeat": now_iso(),
                "stats": self._attempt_stats(stats),
            }
        )
        with writing(self.path, "loading_params.state_dir"):
            atomic_write_json(self.path, self.data)

    def _attempt_stats(self, stats: Mapping[str, Any]) -> dict[str, Any]:
        counters = {k: int(self.data.get(k) or 0) for k in COUNTERS}
        rows = max(0, counters["rows_done"] - self._baseline["rows_done"])
        runtime = float(stats.get("runtime_seconds") or 0.0)
        return {
            **stats,
            **counters,
            "rows_processed": rows,
            "throughput_rows_per_sec": round(rows / runtime, 3) if runtime > 0 else None,
        }


def checkpointed_counters(config: MMirageConfig, shard_id: int, fp: str) -> dict[str, int]:
    """The shard's counters as its checkpoints hold them: published datasets in full, the
    others up to the checkpoint a run would resume from (nothing for another config's)."""
    lp = config.loading_params
    totals = dict.fromkeys(COUNTERS, 0)
    for ds in lp.datasets:
        out = shard_output(lp, ds, shard_id)
        ckpt = out.finished() or out.resume_point(fp)
        for key in COUNTERS:
            totals[key] += getattr(ckpt, key)
    return totals


@contextmanager
def shard_lock(path: Path, shard_id: int) -> Iterator[None]:
    """An exclusive, non-blocking lock held for the whole run of one shard."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ShardConflictError(
                f"shard {shard_id} is being run by another process right now (lock {path}); "
                "wait for it to finish, or stop it"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def never_ran(config_path: object) -> str:
    """What ``check`` and ``stats`` say of a pipeline no shard of which has run."""
    return f"no shard of this pipeline has run yet: 'mmirage run {config_path}' starts it"
