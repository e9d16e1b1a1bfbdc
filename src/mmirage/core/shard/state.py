"""Shard state: ``<state_dir>/<pipeline id>/shard_<k>/status.json``, written atomically.

The shape is the original's (reference §3.9) plus what it lacked: a ``heartbeat`` refreshed while
the shard runs (a ``running`` shard whose heartbeat is old, or whose local pid is gone, is
``stale``: dead, and may be retried), counters (``rows_done``, ``rows_failed``, tokens),
``attempts`` (every start; the original's ``retry_count`` counted starts, here it counts real
retries, ``attempts - 1``), and a ``fingerprint`` of what decides the rows (inputs, outputs,
schema, datasets, ``num_shards``) so a changed config is never mixed into old results.

The pipeline id (a hash of the datasets' output dirs and ``num_shards``) keeps two pipelines that
share a ``state_dir`` apart (the original's shared default made them collide).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


class ShardConflictError(Exception):
    """The shard cannot run as asked (another live process holds it, or the config changed
    since its results were written); ``str(err)`` says what to do."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _parse_iso(text: Any) -> float | None:
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
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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


def fingerprint(config: MMirageConfig) -> str:
    """Changes when the rows a shard produces would change (not for rpm, retries, SLURM...)."""
    pp, lp = config.processing_params, config.loading_params
    return _digest(
        {
            "inputs": _plain(pp.inputs),
            "outputs": _plain(pp.outputs),
            "output_schema": _plain(pp.output_schema),
            "remove_columns": pp.remove_columns,
            "datasets": _plain(lp.datasets),
            "num_shards": lp.num_shards,
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
    beat = _parse_iso(status.get("heartbeat") or status.get("started_at"))
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

    @property
    def state(self) -> str:
        return shard_state(
            self.data or None, self._config.execution_params.max_retries, STALE_AFTER_S
        )

    def start(self, fp: str) -> None:
        lp = self._config.loading_params
        attempts = int(self.data.get("attempts") or 0) + 1
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
        atomic_write_json(self.path, self.data)

    def finish(self, error: str | None, stats: Mapping[str, Any]) -> None:
        self.data.update(
            {
                "status": FAILED if error else SUCCESS,
                "error": error,
                "finished_at": now_iso(),
                "heartbeat": now_iso(),
                "stats": dict(stats),
            }
        )
        atomic_write_json(self.path, self.data)


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
