"""Each shard's line on the landing page, read as ``mmirage check`` reads it (status.json and
``shard_state``), and the pipeline's totals: rows, tokens, cost so far."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.core.shard.live_counters import summed
from mmirage.core.shard.state import RUNNING, read_status, shard_state
from mmirage.rundir import parse_iso

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.rundir import RunDir


@dataclass(frozen=True)
class ShardLine:
    shard_id: int
    state: str
    rows_done: int
    rows_failed: int
    rows_retryable: int
    rows_pending: int | None  # None: the shard's size is not known (yet)
    attempts: str  # made / allowed
    heartbeat: float | None  # seconds since the epoch
    error: str
    started: float | None
    ended: float | None  # finished_at, else the last heartbeat
    baseline: int  # rows the last attempt started from (resumed)
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    unpriced: tuple[str, ...] = ()

    @property
    def heartbeat_age_s(self) -> float | None:
        return None if self.heartbeat is None else max(0.0, time.time() - self.heartbeat)


@dataclass(frozen=True)
class Totals:
    rows_done: int
    rows_failed: int
    rows_retryable: int
    input_tokens: int
    output_tokens: int
    cost_usd: float | None  # None: some model has no known price
    unpriced: list[str]
    states: dict[str, int]


def _int(status: Mapping[str, Any], key: str) -> int:
    try:
        return int(status.get(key) or 0)
    except (TypeError, ValueError):
        return 0


def _requests(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    stats = status.get("stats")
    found = stats.get("requests") if isinstance(stats, dict) else None
    return found if isinstance(found, dict) else None


def _started(
    data: Mapping[str, Any], finished: float | None, stats: Mapping[str, Any]
) -> float | None:
    """When the last attempt started: its end less its runtime when it ended (the times in
    status.json are whole seconds, the runtime is not), else ``started_at``."""
    runtime = stats.get("runtime_seconds") if stats else None
    if finished is not None and isinstance(runtime, int | float) and runtime >= 0:
        return finished - float(runtime)
    return parse_iso(data.get("started_at")) if data.get("started_at") else None


def shard_line(
    shard_id: int, status: Mapping[str, Any] | None, max_retries: int, size: int | None
) -> ShardLine:
    data: Mapping[str, Any] = status or {}
    done = _int(data, "rows_done")
    beat = parse_iso(data.get("heartbeat")) if data else None
    finished = parse_iso(data.get("finished_at")) if data.get("finished_at") else None
    stats: Mapping[str, Any] = data["stats"] if isinstance(data.get("stats"), dict) else {}
    processed = _int(stats, "rows_processed") if stats else 0
    requests = summed([_requests(data)])
    return ShardLine(
        shard_id=shard_id,
        state=shard_state(status, max_retries),
        rows_done=done,
        rows_failed=_int(data, "rows_failed"),
        rows_retryable=_int(data, "rows_retryable"),
        rows_pending=None if size is None else max(0, size - done),
        attempts=f"{_int(data, 'attempts')}/{max_retries + 1}",
        heartbeat=beat,
        error=" ".join(str(data.get("error") or "").split()),
        started=_started(data, finished, stats),
        ended=finished if finished is not None else beat,
        baseline=max(0, done - processed) if finished is not None else 0,
        input_tokens=_int(data, "input_tokens"),
        output_tokens=_int(data, "output_tokens"),
        cost_usd=requests.cost_usd if requests.live else None,
        unpriced=tuple(requests.unpriced),
    )


class StatusCache:
    """status.json files as ``read_status`` reads them, read again only once changed: a page of
    1,000 shards stats 1,000 files instead of parsing them."""

    def __init__(self, run_dir: RunDir) -> None:
        self.paths = [run_dir.status_path(k) for k in range(run_dir.num_shards)]  # built once
        self._seen: dict[Path, tuple[tuple[int, int], dict[str, Any] | None]] = {}
        # Lines of shards not running (a running one's state changes with time: stale).
        self._lines: dict[int, tuple[tuple[int, int], int | None, ShardLine]] = {}

    def line(self, shard_id: int, max_retries: int, size: int | None) -> ShardLine:
        status = self.read(self.paths[shard_id])
        key = self._seen[self.paths[shard_id]][0] if status is not None else (0, 0)
        cached = self._lines.get(shard_id)
        if cached is not None and cached[0] == key and cached[1] == size:
            return cached[2]
        line = shard_line(shard_id, status, max_retries, size)
        if (status or {}).get("status") != RUNNING:
            self._lines[shard_id] = (key, size, line)
        return line

    def read(self, path: Path) -> dict[str, Any] | None:
        try:
            info = os.stat(path)
        except OSError:
            self._seen.pop(path, None)
            return None
        key = (info.st_mtime_ns, info.st_size)
        cached = self._seen.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        status = read_status(path)
        self._seen[path] = (key, status)
        return status

    def written_at(self, path: Path) -> int:
        """When ``path`` was last written as of its last ``read`` (ns; 0: never read)."""
        cached = self._seen.get(path)
        return cached[0][0] if cached is not None else 0


def read_shards(
    config: MMirageConfig, run_dir: RunDir, sizes: Mapping[int, int], statuses: StatusCache
) -> tuple[list[ShardLine], Totals]:
    """Every shard's line (``sizes``: rows per shard, where known) and the totals."""
    max_retries = config.execution_params.max_retries
    lines = [statuses.line(k, max_retries, sizes.get(k)) for k in range(run_dir.num_shards)]
    states: dict[str, int] = {}
    for line in lines:
        states[line.state] = states.get(line.state, 0) + 1
    costs = [line.cost_usd for line in lines if line.cost_usd is not None]
    unpriced = sorted({model for line in lines for model in line.unpriced})
    totals = Totals(
        rows_done=sum(line.rows_done for line in lines),
        rows_failed=sum(line.rows_failed for line in lines),
        rows_retryable=sum(line.rows_retryable for line in lines),
        input_tokens=sum(line.input_tokens for line in lines),
        output_tokens=sum(line.output_tokens for line in lines),
        cost_usd=sum(costs) if costs else None,
        unpriced=unpriced,
        states=states,
    )
    return lines, totals
