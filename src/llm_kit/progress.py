"""An optional progress bar for long runs: done, failed, rate and ETA on stderr, and a caller's
note (more counters) on the line below it, so that a narrow terminal keeps the bar readable."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.progress import Progress, TaskID


@cache
def _noted_progress() -> type[Progress]:
    """rich's ``Progress`` with a line of text below its bars (imported on first use)."""
    from rich.progress import Progress
    from rich.text import Text

    class NotedProgress(Progress):
        note = ""

        def get_renderables(self) -> Iterable[RenderableType]:
            yield from super().get_renderables()
            if self.note:
                yield Text(self.note, no_wrap=True, overflow="ellipsis")

    return NotedProgress


class ProgressBar:
    """``with ProgressBar(total) as bar: bar.advance(ok)``; a no-op when disabled."""

    def __init__(
        self,
        total: int | None,
        *,
        enabled: bool,
        description: str = "items",
        completed: int = 0,
        failed: int = 0,
    ) -> None:
        self.failed = failed  # ``completed``/``failed``: already done by an earlier run
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if enabled:
            # Imported here: rich costs every run without a bar ~2 MB and ~20 ms of start-up.
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._progress = _noted_progress()(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("[red]{task.fields[failed]} failed"),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=False,
            )
            self._task = self._progress.add_task(
                description, total=total, completed=completed, failed=failed, rate=""
            )

    def advance(self, ok: bool) -> None:
        self.add(1, 0 if ok else 1)

    def add(self, done: int, failed: int = 0) -> None:
        """``done`` more items, ``failed`` of them failed."""
        if self._progress is None or self._task is None:
            return
        self.failed += failed
        self._progress.advance(self._task, done)
        task = self._progress.tasks[0]
        speed = task.speed
        self._progress.update(
            self._task, failed=self.failed, rate=f"{speed:,.1f}/s" if speed else ""
        )

    def note(self, text: str) -> None:
        """Show ``text`` on the line below the bar (a caller's own counters)."""
        if self._progress is not None:
            self._progress.note = text  # type: ignore[attr-defined]  # a NotedProgress

    def __enter__(self) -> ProgressBar:
        self.start()
        return self

    def start(self) -> None:
        """Start drawing (``__enter__`` for callers that cannot use ``with``)."""
        if self._progress is not None:
            self._progress.start()

    def close(self) -> None:
        """Stop drawing (``__exit__`` for callers that cannot use ``with``)."""
        if self._progress is not None:
            self._progress.stop()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
