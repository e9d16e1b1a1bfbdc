"""The total line of a parallel run: every shard's rows, rate, ETA and live requests, from the
records its child writes once a second (``core.shard.progress``, ``records`` mode), from the
first second on.

The rows to do are counted in a thread as the children start (opening the datasets, as each
child does for its own shard); until then the line has no total and no ETA. Shards with no
record (not started yet, or finished before this run) count what their ``status.json`` said
when the run began.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

from mmirage.core.shard.live_counters import RequestTotals, progress_line
from mmirage.core.shard.progress import RECORD_PREFIX

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig


class LiveTotal:
    """Fed by the relay threads (``take``), read by the parent's loop (``line``)."""

    def __init__(self, before: dict[int, tuple[int, int]]) -> None:
        self.before = before  # shard -> (rows done, rows failed) when the run began
        self.total: int | None = None
        self.started = time.monotonic()
        self._records: dict[tuple[int, int], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def count_rows(self, cfg: MMirageConfig, shards: list[int]) -> None:
        """Count the rows of ``shards`` in a thread (``total`` stays None if that fails)."""
        threading.Thread(target=self._count, args=(cfg, shards), daemon=True).start()

    def _count(self, cfg: MMirageConfig, shards: list[int]) -> None:
        from mmirage.core.loader import open_datasets, plan_shard

        lp = cfg.loading_params
        try:
            sources = open_datasets(lp.datasets)
            self.total = sum(
                part.num_rows for k in shards for part in plan_shard(sources, lp.num_shards, k)
            )
        except Exception:  # the children report the same problem, in their own words
            return

    def take(self, shard_id: int, text: str) -> bool:
        """Keep ``text`` if it is a progress record (True), else leave it to be relayed."""
        if not text.startswith(RECORD_PREFIX):
            return False
        try:
            record = json.loads(text[len(RECORD_PREFIX) :])
            key = (shard_id, int(record.get("dataset") or 0))
        except (ValueError, TypeError, AttributeError):
            return False
        with self._lock:
            self._records[key] = record
        return True

    def line(self) -> str:
        """``1,200/5,000 rows (24%), 41.2 rows/s, ETA 1m32s, 3 failed, 12 retried, …``"""
        with self._lock:
            records = list(self._records.items())
        done_by = {k: 0 for k in self.before}
        failed_by = dict.fromkeys(self.before, 0)
        new = 0
        requests = RequestTotals()
        for (shard, _), record in records:
            done_by[shard] = done_by.get(shard, 0) + int(record.get("done") or 0)
            failed_by[shard] = failed_by.get(shard, 0) + int(record.get("failed") or 0)
            new += max(0, int(record.get("done") or 0) - int(record.get("resumed") or 0))
            requests = requests.plus(RequestTotals.from_json(record.get("requests") or {}))
        done = sum(max(d, self.before.get(k, (0, 0))[0]) for k, d in done_by.items())
        failed = sum(max(f, self.before.get(k, (0, 0))[1]) for k, f in failed_by.items())
        rate = new / max(time.monotonic() - self.started, 1e-9)
        return progress_line(done, self.total, failed, rate, requests)
