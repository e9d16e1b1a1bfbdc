"""Shard state: ``<state_dir>/<pipeline id>/shard_<k>/status.json``, written atomically.

The shape is the original's (reference §3.9) plus what it lacked: a ``heartbeat`` refreshed while
the shard runs (a ``running`` shard whose heartbeat is old, or whose local pid is gone, is
``stale``: dead, and may be retried), counters (``rows_done``, ``rows_failed``, tokens),
``attempts`` (every start; the original's ``retry_count`` counted starts, here it counts real
retries, ``attempts - 1``), and a ``fingerprint`` of what decides the rows (inputs, outputs,
schema, datasets, ``num_shards``) so a changed config is never mixed into old results.

Counters are kept consistent across attempts: ``start`` sets them to what the checkpoints hold
(not to what a killed attempt last wrote), the runner advances them per checkpoint, and
``finish`` derives ``stats.rows_processed`` (rows this attempt added) and the throughput from
them, so no resume, crash or forced rerun can make them negative.

The pipeline id (a hash of the datasets' output dirs and ``num_shards``) keeps two pipelines that
share a ``state_dir`` apart (the original's shared default made them collide).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.core.shard.disk import writing
from mmirage.errors import UserError, WorkFailed

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


# rows_retryable: failed rows whose every failure a retry may fix (``mmirage retry`` reruns them)
COUNTERS = ("rows_done", "rows_failed", "rows_retryable", "input_tokens", "output_tokens")


class UnusableDirError(UserError):
    """A directory a run must write to cannot be used (a file in the way, no permission, a
    read-only disk); ``str(err)`` names the config field, the path and what to do."""


class ShardConflictError(WorkFailed):
    """The shard cannot run as asked (another live process holds it, or the config changed
    since its results were written); ``str(err)`` says what to do."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def parse_iso(text: Any) -> float | None:
    try:
        moment = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    if moment.tzinfo is None:  # the original wrote naive local times
        moment = moment.astimezone()
    return moment.timestamp()


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``path`` so that a reader sees the old or the new content, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written copy would only take more space
        raise


_PATH_FIXES = {
    errno.ENOTDIR: "is a file, not a directory; move the file away or choose another path",
    errno.EEXIST: "is a file, not a directory; move the file away or choose another path",
    errno.EACCES: "is not writable; give write permission or choose another directory",
    errno.EPERM: "is not writable; give write permission or choose another directory",
    errno.EROFS: "is on a read-only filesystem; choose a directory on a writable disk",
}


def ensure_writable_dir(path: Path, field: str) -> None:
    """Prove that ``path`` can be created and written, or raise ``UnusableDirError`` naming
    ``field``. Run before a shard starts: a path problem is the user's to fix, and must not
    surface as a failed shard with a raw errno message. Nothing is created: a run refused
    later (a missing key, say) leaves no empty folders behind."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".mmirage-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise unusable_dir(exc, path, field) from None


def is_path_problem(exc: OSError) -> bool:
    """Whether ``exc`` is a path the user must fix (a file in the way, no permission, a
    read-only disk), as opposed to a failure of the work (disk full, I/O error)."""
    return exc.errno in _PATH_FIXES


def unusable_dir(exc: OSError, path: Path, field: str) -> UnusableDirError:
    """``exc`` (raised while writing under ``path``) as one sentence: field, path, what to do."""
    where = _blocking_path(path)
    fix = _PATH_FIXES.get(exc.errno or 0)
    if fix is None:
        fix = f"cannot be written ({exc.strerror or exc}); check the path and the disk"
    return UnusableDirError(f"{field}: {where} {fix}")


def _blocking_path(path: Path) -> Path:
    """The part of ``path`` to name: its first component that is not a directory (a file in
    the way, or the first one that could not be created), else ``path`` itself."""
    for candidate in [*reversed(path.parents), path]:
        if not candidate.is_dir():
            return candidate
    return path


def _plain(value: Any) -> Any:
    """A config value as JSON-able data (dataclass init fields only: no derived objects)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pipeline_id(config: MMirageConfig) -> str:
    lp = config.loading_params
    dirs = [os.path.abspath(os.path.expanduser(d.output_dir)) for d in lp.datasets]
    return f"pipeline-{_digest([dirs, lp.num_shards])}"


# Processor fields that change how rows are computed, not what comes out: pacing, retries,
# timeouts, pools, chunking and bookkeeping. Everything else (model, server, sampling, script,
# function, fallback...) is part of the fingerprint.
_OPERATIONAL = frozenset(
    {
        "name",
        "rpm",
        "tpm",
        "worker_concurrency",
        "input_buffer_size",
        "max_retries",
        "request_timeout",
        "timeout_ms",
        "max_timeouts",
        "max_errors",
        "max_workers",
        "start_method",
        "max_chunk_bytes",
        "max_requests_per_chunk",
        "metadata_output_path",
        "oversized_request_policy",
        "completion_window",
        "timeout_seconds",
        "metadata",
        "price_per_mtok",
    }
)


def _results_relevant(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _results_relevant(v) for k, v in value.items() if k not in _OPERATIONAL}
    return value


def fingerprint(config: MMirageConfig) -> str:
    """Changes when the rows a shard produces would change: inputs, outputs, schema, data and
    the processors' models, sampling and functions (not rpm, retries, SLURM...)."""
    pp, lp = config.processing_params, config.loading_params
    return _digest(
        {
            "inputs": _plain(pp.inputs),
            "outputs": _plain(pp.outputs),
            "output_schema": _plain(pp.output_schema),
            "remove_columns": pp.remove_columns,
            "datasets": _plain(lp.datasets),
            "num_shards": lp.num_shards,
            "processors": [_results_relevant(_plain(p)) for p in config.processors],
        }
    )


def shard_dir(config: MMirageConfig, shard_id: int) -> Path:
    state_dir = config.loading_params.state_dir or "."
    return Path(os.path.expanduser(state_dir)) / pipeline_id(config) / f"shard_{shard_id}"


def status_path(config: MMirageConfig, shard_id: int) -> Path:
    return shard_dir(config, shard_id) / "status.json"


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

    def __init__(self, config: MMirageConfig, shard_id: int) -> None:
        self.path = status_path(config, shard_id)
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
    from mmirage.core.shard.output import ShardOutput  # it imports this module

    lp = config.loading_params
    totals = dict.fromkeys(COUNTERS, 0)
    for ds in lp.datasets:
        out = ShardOutput(ds.output_dir, shard_id, lp.num_shards, lp.output_format)
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
