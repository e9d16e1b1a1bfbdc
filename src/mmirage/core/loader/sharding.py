"""Contiguous shards, exactly as the original (HF ``Dataset.shard(n, k, contiguous=True)``).

Every dataset is sharded on its own (never concatenated) and, for a dataset with splits, every
split on its own, so shard ``k`` of each dataset goes to ``<output_dir>/shard_<k>`` as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mmirage.core.loader.base import BadRowSink, DatasetSource, OnBadRow, Row


def shard_range(num_rows: int, num_shards: int, shard_id: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of shard ``shard_id``: contiguous blocks, and the first
    ``num_rows % num_shards`` shards get one extra row (the original's formula, so shard
    outputs match it row for row)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be in [0, {num_shards - 1}], got {shard_id}")
    if num_rows < 0:
        raise ValueError(f"num_rows must be non-negative, got {num_rows}")
    div, mod = divmod(num_rows, num_shards)
    start = div * shard_id + min(shard_id, mod)
    return start, start + div + (1 if shard_id < mod else 0)


@dataclass(frozen=True)
class ShardRange:
    """Row ids ``[start, stop)`` of one split (``None``: a dataset without splits)."""

    split: str | None
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class DatasetShard:
    """One dataset's part of a shard: what to read, and where its output goes."""

    source: DatasetSource
    num_shards: int
    shard_id: int
    ranges: tuple[ShardRange, ...]

    @property
    def dataset_index(self) -> int:
        return self.source.index

    @property
    def output_dir(self) -> str:
        return self.source.output_dir

    @property
    def num_rows(self) -> int:
        return sum(len(r) for r in self.ranges)

    def iter_rows(
        self, *, on_bad_row: OnBadRow = "fail", bad_rows: BadRowSink | None = None
    ) -> Iterator[Row]:
        """This shard's rows, split after split, in row-id order."""
        for r in self.ranges:
            yield from self.source.iter_rows(
                r.start, r.stop, split=r.split, on_bad_row=on_bad_row, bad_rows=bad_rows
            )


def shard_dataset(source: DatasetSource, num_shards: int, shard_id: int) -> DatasetShard:
    ranges = tuple(
        ShardRange(split, *shard_range(source.reader(split).num_rows, num_shards, shard_id))
        for split in source.splits
    )
    return DatasetShard(source, num_shards, shard_id, ranges)


def plan_shard(
    sources: Sequence[DatasetSource], num_shards: int, shard_id: int
) -> list[DatasetShard]:
    """Shard ``shard_id`` of every dataset, in config order (index ``i`` is ``datasets[i]``)."""
    return [shard_dataset(source, num_shards, shard_id) for source in sources]
