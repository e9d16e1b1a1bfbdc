"""``ShardReport``: what one run of a shard did (rows, tokens, published files, notes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmirage.core.shard.output import ShardCheckpoint
from mmirage.rundir import COUNTERS


@dataclass
class ShardReport:
    shard_id: int
    num_shards: int
    skipped: bool = False  # already finished: nothing was run
    rows_done: int = 0
    rows_failed: int = 0
    rows_retryable: int = 0  # failed rows 'mmirage retry' can run again
    input_tokens: int = 0
    output_tokens: int = 0
    resumed_rows: int = 0  # rows found done by an earlier, interrupted attempt
    runtime_seconds: float = 0.0
    published: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # processors' summaries (cost estimates...)
    first_row_error: str | None = None  # "<row key>: <reason>" of this run's first failed row

    def add(self, ckpt: ShardCheckpoint) -> None:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(ckpt, name))

    def counters(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS}
