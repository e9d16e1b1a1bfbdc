"""A shard's progress: rows counted as they finish (a row when its last output is done, or
when it fails), not when their processing group lands, so a run that is one group long still
moves and has an ETA; with the live requests' counters (retried, rate-limited, tokens, cost).

Where it goes depends on who reads stderr (``progress_mode``): a person at a terminal gets a
bar; a log (a SLURM task's, ``nohup``, ``> log 2>&1``) gets one line every
``execution_params.progress_interval_seconds``; the child of a parallel run writes a record a
second for its parent, which shows one total line (``executors.live_total``).

The hot path only adds to two integers (``RowCount``, one event loop: no lock); a task
copies them out at its own pace.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass

from llm_kit.progress import ProgressBar
from mmirage.core.shard.live_counters import (
    RequestCounter,
    RequestTotals,
    progress_line,
    request_parts,
)

REFRESH_S = 0.25  # the bar
RECORD_EVERY_S = 1.0  # a parallel run's child, for its parent's total line
PROGRESS_ENV = "MMIRAGE_PROGRESS"  # "0": none; RECORDS: a parallel run's child
RECORDS = "records"
RECORD_PREFIX = "\x1emmirage-progress "  # a record line, which the parent does not relay
BAR, LINES, OFF = "bar", "lines", "off"


@dataclass
class RowCount:
    done: int = 0
    failed: int = 0

    def finish(self, failed: bool) -> None:
        self.done += 1
        self.failed += failed


def progress_mode() -> str:
    """``bar`` when a person watches stderr; ``lines`` when it is a log or a pipe; ``records``
    in the children of a parallel run (their parent shows the total); ``off`` when
    ``MMIRAGE_PROGRESS=0``."""
    setting = os.environ.get(PROGRESS_ENV, "1")
    if setting == "0":
        return OFF
    if setting == RECORDS:
        return RECORDS
    return BAR if sys.stderr.isatty() else LINES


def say(line: str) -> None:
    """One whole line on stderr, at once (a log may be shared with other writers). A reader
    gone (a parallel run's parent killed) costs the line, never the shard."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def stamped(line: str) -> str:
    return f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}"


class RowProgress:
    """The progress of one dataset's shard, fed from ``count`` (rows) and ``requests``."""

    def __init__(
        self,
        total: int,
        description: str,
        done: int,
        failed: int,
        *,
        requests: RequestCounter | None = None,
        interval_s: float = 30.0,
        where: tuple[int, int] = (0, 0),
    ) -> None:
        self.mode = progress_mode()
        self.enabled = self.mode == BAR
        self.count = RowCount()
        self.total, self.description = total, description
        self.resumed, self.resumed_failed = done, failed  # done by an earlier run
        self.requests = requests
        self.interval_s = interval_s
        self.where = where  # (shard, dataset): a record's key
        self.bar = ProgressBar(
            total, enabled=self.enabled, description=description, completed=done, failed=failed
        )
        self._shown = RowCount()
        self._task: asyncio.Task[None] | None = None
        self._started = time.monotonic()

    def start(self) -> None:
        self._started = time.monotonic()
        self.bar.start()
        if self.mode != OFF:
            self._task = asyncio.create_task(self._follow())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._sync()
        if self.mode == RECORDS:
            self._record()  # the last counts, for the parent's total
        self.bar.close()

    def line(self) -> str:
        """``<description>: 1,200/5,000 rows (24%), 41.2 rows/s, ETA 1m32s, 3 failed, …``"""
        rate = self.count.done / max(time.monotonic() - self._started, 1e-9)
        done = self.resumed + self.count.done
        failed = self.resumed_failed + self.count.failed
        counts = progress_line(done, self.total, failed, rate, self._requests())
        return f"{self.description}: {counts}"

    async def _follow(self) -> None:
        if self.mode == RECORDS:
            self._record()  # at once: the parent's line is live from the first second
        tick = {BAR: REFRESH_S, RECORDS: RECORD_EVERY_S}.get(self.mode, self.interval_s)
        show = {BAR: self._sync, LINES: self._log_line, RECORDS: self._record}[self.mode]
        while True:
            await asyncio.sleep(tick)
            show()

    def _log_line(self) -> None:
        say(stamped(self.line()))

    def _requests(self) -> RequestTotals:
        return self.requests.totals() if self.requests is not None else RequestTotals()

    def _sync(self) -> None:
        done, failed = self.count.done - self._shown.done, self.count.failed - self._shown.failed
        if done or failed:
            self.bar.add(done, failed)
            self._shown.done, self._shown.failed = self.count.done, self.count.failed
        if self.enabled and self.requests is not None:
            self.bar.note(", ".join(request_parts(self._requests())))

    def _record(self) -> None:
        shard, dataset = self.where
        record = {
            "shard": shard,
            "dataset": dataset,
            "total": self.total,
            "done": self.resumed + self.count.done,
            "failed": self.resumed_failed + self.count.failed,
            "resumed": self.resumed,
            "requests": self._requests().as_json(),
        }
        say(RECORD_PREFIX + json.dumps(record))
