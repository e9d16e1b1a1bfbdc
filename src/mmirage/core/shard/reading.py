"""Reading a shard's source rows: from a checkpoint's cursor on (a run), or one row by its
row key (``mmirage retry`` computing a failed row again); and where each split starts in the
pipeline's global row order."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Protocol

from mmirage.core.loader import BadRow, DatasetShard, DatasetSource, Row
from mmirage.core.loader.base import OnBadRow

Item = Row | BadRow


class Cursor(Protocol):
    """Where a shard reads on (a checkpoint): the range to read next and its first row id."""

    range_index: int
    next_row_id: int | None


def groups_from(
    shard: DatasetShard, cursor: Cursor, size: int, on_bad_row: OnBadRow = "skip"
) -> Iterator[tuple[int, list[Item]]]:
    """The shard's rows from the checkpoint's cursor on, ``size`` at a time (a group may span
    ranges; the last may be smaller), unreadable rows in their place (``on_bad_row="fail"``:
    the loader raises ``DataError`` at the first one instead); each group with the index of
    the range its last row is in. Rows are taken from the reader a group at a time: no Python
    step per row."""
    group: list[Item] = []
    first, next_row_id = cursor.range_index, cursor.next_row_id  # before any group lands
    last = first  # the range of the group's last row
    for index in range(first, len(shard.ranges)):
        r = shard.ranges[index]
        start = r.start if index != first or next_row_id is None else next_row_id
        bad: list[BadRow] = []
        rows = shard.source.iter_rows(
            start, r.stop, split=r.split, on_bad_row=on_bad_row, bad_rows=bad.append
        )
        while True:
            taken: list[Item] = list(itertools.islice(rows, size - len(group)))
            if bad:  # each before the row that follows it (a range's row ids only grow)
                taken = sorted([*taken, *bad], key=_row_id)
                bad.clear()
            if not taken:
                break  # this range is read
            group += taken
            last = index
            # Unreadable rows count too: a long run of them makes several groups, not one.
            while len(group) >= size:
                yield index, group[:size]
                group = group[size:]
    if group:
        yield last, group


def _row_id(item: Item) -> int:
    return item.row_id


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
