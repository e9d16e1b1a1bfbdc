"""A shard's progress bar: rows counted as they finish (a row when its last output is done, or
when it fails), not when their processing group lands, so a run that is one group long still
moves and has an ETA.

The hot path only adds to two integers (``RowCount``, one event loop: no lock); a task
copies them into the bar a few times a second, and the bar draws at its own rate.
"""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass

from llm_kit.progress import ProgressBar

REFRESH_S = 0.25


@dataclass
class RowCount:
    done: int = 0
    failed: int = 0

    def finish(self, failed: bool) -> None:
        self.done += 1
        self.failed += failed


def show_progress() -> bool:
    """A progress bar (rows, failures, rows/s, ETA) when a person watches stderr; never in
    logs, pipes or the children of a parallel run (their parent shows one status line)."""
    return sys.stderr.isatty() and os.environ.get("MMIRAGE_PROGRESS", "1") != "0"


class RowProgress:
    """The bar of one dataset's shard, fed from ``count``."""

    def __init__(self, total: int, description: str, done: int, failed: int) -> None:
        self.enabled = show_progress()
        self.count = RowCount()
        self.bar = ProgressBar(
            total, enabled=self.enabled, description=description, completed=done, failed=failed
        )
        self._shown = RowCount()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.bar.start()
        if self.enabled:
            self._task = asyncio.create_task(self._follow())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._sync()
        self.bar.close()

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            self._sync()

    def _sync(self) -> None:
        done, failed = self.count.done - self._shown.done, self.count.failed - self._shown.failed
        if done or failed:
            self.bar.add(done, failed)
            self._shown.done, self._shown.failed = self.count.done, self.count.failed
