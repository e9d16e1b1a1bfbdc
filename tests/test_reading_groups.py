"""A shard's rows come to the runner a group at a time (``groups_from``): groups of the asked
size that may span ranges, each with the range of its last row (the checkpoint's cursor), and
unreadable rows in their place."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mmirage.config.loading_params import DatasetConfig
from mmirage.core.loader import BadRow, open_dataset
from mmirage.core.loader.sharding import DatasetShard, ShardRange
from mmirage.core.shard.reading import Item, groups_from


@dataclass
class Cursor:
    range_index: int = 0
    next_row_id: int | None = None


def _splits_shard(tmp_path: Path, lines: dict[str, list[str]]) -> DatasetShard:
    paths = {}
    for split, rows in lines.items():
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(row + "\n" for row in rows))
        paths[split] = str(path)
    source = open_dataset(DatasetConfig(path=paths, type="JSONL", output_dir=str(tmp_path)))
    ranges = tuple(ShardRange(split, 0, len(rows)) for split, rows in lines.items())
    return DatasetShard(source, 1, 0, ranges)


def _ids(group: list[Item]) -> list[tuple[str | None, int, bool]]:
    return [(item.split, item.row_id, isinstance(item, BadRow)) for item in group]


def test_groups_have_the_asked_size_span_ranges_and_name_the_last_rows_range(
    tmp_path: Path,
) -> None:
    shard = _splits_shard(
        tmp_path,
        {"a": [f'{{"i": {i}}}' for i in range(5)], "b": [f'{{"i": {i}}}' for i in range(4)]},
    )
    groups = list(groups_from(shard, Cursor(), 4))
    assert [(index, len(group)) for index, group in groups] == [(0, 4), (1, 4), (1, 1)]
    # The second group holds a's last row and b's first three.
    assert _ids(groups[1][1]) == [("a", 4, False)] + [("b", i, False) for i in range(3)]
    assert [item.data["i"] for _, group in groups for item in group] == [*range(5), *range(4)]


def test_a_cursor_inside_a_range_starts_at_its_row(tmp_path: Path) -> None:
    shard = _splits_shard(
        tmp_path, {"a": [f'{{"i": {i}}}' for i in range(3)], "b": ['{"i": 0}', '{"i": 1}']}
    )
    groups = list(groups_from(shard, Cursor(range_index=1, next_row_id=1), 10))
    assert [(index, _ids(group)) for index, group in groups] == [(1, [("b", 1, False)])]
    assert list(groups_from(shard, Cursor(range_index=2), 10)) == []


def test_unreadable_rows_keep_their_place_in_and_across_groups(tmp_path: Path) -> None:
    rows = ['{"i": 0}', "{not json", '{"i": 2}', '{"i": 3}', "[1]", "oops", '{"i": 6}', "]"]
    shard = _splits_shard(tmp_path, {"a": rows})
    groups = list(groups_from(shard, Cursor(), 2))
    ids = [item.row_id for _, group in groups for item in group]
    assert ids == list(range(8))
    bad = [item.row_id for _, group in groups for item in group if isinstance(item, BadRow)]
    assert bad == [1, 4, 5, 7]
    # Unreadable rows count towards a group's size: a long run of them cannot make one huge
    # group.
    assert [len(group) for _, group in groups] == [2, 2, 2, 2]


def test_a_long_run_of_unreadable_rows_makes_groups_of_the_size(tmp_path: Path) -> None:
    shard = _splits_shard(tmp_path, {"a": ["oops"] * 25 + ['{"i": 25}']})
    groups = list(groups_from(shard, Cursor(), 10))
    assert [len(group) for _, group in groups] == [10, 10, 6]
    assert [item.row_id for _, group in groups for item in group] == list(range(26))


def test_the_last_group_names_the_range_of_its_last_row_when_later_ranges_are_empty(
    tmp_path: Path,
) -> None:
    shard = _splits_shard(tmp_path, {"a": ['{"i": 0}', '{"i": 1}'], "b": [], "c": []})
    assert [(index, len(group)) for index, group in groups_from(shard, Cursor(), 10)] == [(0, 2)]
