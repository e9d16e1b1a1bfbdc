"""Reading a shard's source rows: from a checkpoint's cursor on (a run), or one row by its
row key (``mmirage retry`` computing a failed row again); and where each split starts in the
pipeline's global row order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from mmirage.core.loader import BadRow, DatasetShard, DatasetSource, Row
from mmirage.core.loader.base import OnBadRow

Item = Row | BadRow


class Cursor(Protocol):
    """Where a shard reads on (a checkpoint): the range to read next and its first row id."""

    range_index: int
    next_row_id: int | None


def rows_from(
    shard: DatasetShard, cursor: Cursor, on_bad_row: OnBadRow = "skip"
) -> Iterator[tuple[int, Item]]:
    """The shard's rows from the checkpoint's cursor on, unreadable rows in their place
    (``on_bad_row="fail"``: the loader raises ``DataError`` at the first one instead)."""
    bad: list[BadRow] = []
    for index, r in enumerate(shard.ranges):
        if index < cursor.range_index:
            continue
        start = r.start
        if index == cursor.range_index and cursor.next_row_id is not None:
            start = cursor.next_row_id
        rows = shard.source.iter_rows(
            start, r.stop, split=r.split, on_bad_row=on_bad_row, bad_rows=bad.append
        )
        for row in rows:
            if bad:  # reported before the row that follows them
                yield from ((index, b) for b in bad)
                bad.clear()
            yield index, row
        yield from ((index, b) for b in bad)
        bad.clear()


def source_offsets(sources: list[DatasetSource]) -> dict[tuple[int, str | None], int]:
    """Where each (dataset, split) starts in the pipeline's global row order (config order):
    ``offset + row_id`` is a row's ``source_index``, unique over every dataset and shard."""
    offsets: dict[tuple[int, str | None], int] = {}
    total = 0
    for source in sources:
        for split in source.splits:
            offsets[(source.index, split)] = total
            total += source.reader(split).num_rows
    return offsets


def row_by_key(shard: DatasetShard, key: str) -> Item | None:
    """The source row a row key (``"<dataset>:<split>:<row id>"``) names, read again; ``None``
    when the key is not one of ``shard``'s rows."""
    dataset, _, rest = key.partition(":")
    split, _, row_id = rest.rpartition(":")
    if dataset != str(shard.dataset_index) or not row_id.isdigit():
        return None
    number = int(row_id)
    for r in shard.ranges:
        if (r.split or "") == split and r.start <= number < r.stop:
            bad: list[BadRow] = []
            rows = shard.source.iter_rows(
                number, number + 1, split=r.split, on_bad_row="skip", bad_rows=bad.append
            )
            found: list[Item] = [*rows, *bad]
            return found[0] if found else None
    return None
