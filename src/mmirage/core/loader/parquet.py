"""Parquet, streamed by record batches from the row groups that overlap the requested range.

``num_rows`` comes from the files' footers; no data page is read before iteration. A directory
means every ``*.parquet`` file in it, in name order, as one sequence of row ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from mmirage.core.loader.base import BadRowSink, OnBadRow, Opener, Row, RowReader, check_bounds

DEFAULT_BATCH_SIZE = 1024


class ParquetReader(RowReader):
    """Parquet files read as one sequence (row ids continue from one file to the next)."""

    def __init__(
        self,
        files: list[str],
        file_rows: list[int],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        opener: Opener | None = None,
    ) -> None:
        super().__init__(None)
        self.files = files
        self._open = opener  # None: pyarrow opens (and memory-maps) local files itself
        self._file_rows = file_rows
        self._batch_size = batch_size

    @property
    def num_rows(self) -> int:
        return sum(self._file_rows)

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        on_bad_row: OnBadRow = "fail",  # Parquet rows are typed: there is no malformed row
        bad_rows: BadRowSink | None = None,
    ) -> Iterator[Row]:
        start, end = check_bounds(start, stop, self.num_rows)
        assert end is not None
        base = 0
        for path, count in zip(self.files, self._file_rows, strict=True):
            lo, hi = max(start, base), min(end, base + count)
            if lo < hi:
                yield from self._iter_file(path, lo - base, hi - base, base)
            base += count
            if base >= end:
                return

    def _iter_file(self, path: str, lo: int, hi: int, base: int) -> Iterator[Row]:
        import pyarrow.parquet as pq

        with _source(path, self._open) as source, pq.ParquetFile(source) as pf:
            groups, row = _overlapping_row_groups(pf.metadata, lo, hi)
            for batch in pf.iter_batches(batch_size=self._batch_size, row_groups=groups):
                a, b = max(lo - row, 0), min(hi - row, batch.num_rows)
                if a < b:
                    records: list[dict[str, Any]] = batch.slice(a, b - a).to_pylist()
                    for i, record in enumerate(records):
                        yield Row(base + row + a + i, record)
                row += batch.num_rows
                if row >= hi:
                    return


def _overlapping_row_groups(metadata: Any, lo: int, hi: int) -> tuple[list[int], int]:
    """Row groups holding rows ``[lo, hi)`` of a file, and the row where the first one starts."""
    groups: list[int] = []
    first = pos = 0
    for g in range(metadata.num_row_groups):
        count = metadata.row_group(g).num_rows
        if pos < hi and pos + count > lo:
            if not groups:
                first = pos
            groups.append(g)
        pos += count
    return groups, first


def read_footers(files: list[str], opener: Opener | None = None) -> list[int]:
    """Row count of each file from its footer; raises ``ValueError``/``OSError`` for a bad file."""
    import pyarrow.parquet as pq

    counts = []
    for path in files:
        with _source(path, opener) as source:
            counts.append(pq.read_metadata(source).num_rows)
    return counts


@contextlib.contextmanager
def _source(path: str, opener: Opener | None) -> Iterator[Any]:
    """What pyarrow reads: the path itself, or a file the opener opened (closed after)."""
    if opener is None:
        yield path
        return
    with opener(path) as f:
        yield f
