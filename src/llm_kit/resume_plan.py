"""Which items a resumed ``batch_to_jsonl`` runs, decided item by item in constant memory.

The exact answer comes from ``FinishedIds`` (one ``pread`` per item). Most items of a resume
are found sooner: the output was written in about the order the items come in (completion
order: input order give or take the requests in flight), so a window over the next few
thousand ids of the file, read in step with the items, holds them. An id in the window is in
the file, so the item is skipped; any other one asks the index. The window only saves reads:
a file in another order (a retry appended at the end, items reordered) is answered as
exactly, just more slowly. It serves ``resume`` alone: ``retry_failed`` needs each id's last
line, which only the index knows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from llm_kit.finished_ids import Finished, FinishedIds, id_key
from llm_kit.jsonl import Checkpoint, Head, read_heads
from llm_kit.types import BatchItem

_WIDTH = 8192  # ids read ahead: far more than the requests a crash leaves in flight
_SLIDE = 1024  # misses in a row after which the window moves on


class ResumePlan:
    """Those the file does not hold run, and with ``retry_failed`` those whose last line is a
    retryable failure (remembered in ``retried``, O(retried items), so that their old line can
    go). Close it (or use ``with``) to remove the index's files."""

    def __init__(self, finished: FinishedIds, retry_failed: bool) -> None:
        self.finished = finished
        self.retry_failed = retry_failed
        self.retried: set[str] = set()
        retrying = finished.retryable_lines if retry_failed else 0
        self.skipped = finished.lines - retrying  # about how many items are skipped
        self._window = _Window(*finished.scanned) if finished.scanned and not retry_failed else None

    def skip(self, item: BatchItem) -> bool:
        key = id_key(item.id)
        window = self._window
        if window is not None and window.holds(key):
            return True
        state = self.finished.last_line_of_key(key)
        if window is not None and state is not Finished.ABSENT:
            window.missed()
        if state is Finished.RETRYABLE and self.retry_failed:
            self.retried.add(item.id)
            return False
        return state is not Finished.ABSENT

    def close(self) -> None:
        if self._window is not None:
            self._window.close()
        self.finished.close()

    def __enter__(self) -> ResumePlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


NOTHING_DONE = ResumePlan(FinishedIds.empty(), retry_failed=False)  # a run that is not resumed


class _Window:
    """The ids of the next lines of the output (as it was scanned: not the lines this run
    appends), at most ``_WIDTH`` of them, oldest first. Each hit reads one line more. An item
    the file lacks moves nothing; ``_SLIDE`` items in a row that the file holds but the window
    does not (it lags behind: ids never asked for filled it) move it on twice as far, so that
    it catches up."""

    def __init__(self, path: Path, size: int) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._heads = read_heads(self._file, Checkpoint(), end=size, block_size=1 << 16)
        self._next: Iterator[Head] = iter(())
        self._ahead: dict[bytes, None] = {}
        self._misses = 0
        self._read(_WIDTH)

    def holds(self, key: bytes) -> bool:
        """Whether ``key`` is in the window (then it leaves it)."""
        if key in self._ahead:
            del self._ahead[key]
            self._misses = 0
            self._read(1)
            return True
        return False

    def missed(self) -> None:
        """An id of the file was not in the window."""
        self._misses += 1
        if self._misses >= _SLIDE:
            self._misses = 0
            self._read(2 * _SLIDE)

    def _read(self, lines: int) -> None:
        ahead = self._ahead
        while lines > 0:
            head = next(self._next, None)
            if head is None:
                heads = next(self._heads, None)
                if heads is None:
                    return  # the end of the scanned part
                self._next = iter(heads)
                continue
            item_id = head[0]
            ahead[item_id if isinstance(item_id, bytes) else id_key(item_id)] = None
            lines -= 1
        while len(ahead) > _WIDTH:
            del ahead[next(iter(ahead))]

    def close(self) -> None:
        self._file.close()
