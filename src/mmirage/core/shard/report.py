"""``ShardReport``: what one run of a shard did (rows, tokens, published files, notes), and
how its failed rows are told apart (``failed_summary``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mmirage.core.shard.output import ShardCheckpoint
from mmirage.rundir import COUNTERS


@dataclass
class ShardReport:
    shard_id: int
    num_shards: int
    skipped: bool = False  # already finished: nothing was run
    rows_done: int = 0
    rows_failed: int = 0  # failed for good (validation, truncated, refused…) or retryable
    rows_retryable: int = 0  # failed rows 'mmirage retry' can run again (rate limit, 5xx…)
    input_tokens: int = 0
    output_tokens: int = 0
    resumed_rows: int = 0  # rows found done by an earlier, interrupted attempt
    runtime_seconds: float = 0.0
    published: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # processors' summaries (cost estimates...)
    first_row_error: str | None = None  # "<row key>: <reason>" of this run's first failed row
    # This run's live requests: retries by cause, cool-down, tokens sent, cost (live_counters).
    requests: dict[str, Any] = field(default_factory=dict)

    def add(self, ckpt: ShardCheckpoint) -> None:
        for name in COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(ckpt, name))

    def counters(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in COUNTERS}


# Each kind of failed row, in the words every report uses.
_KINDS = (
    ("for good", "validation, truncated, refused…"),
    ("retryable", "rate limit, server error, timeout…"),
)


def failed_summary(failed: int, retryable: int) -> str:
    """``"0 failed"``, or the failed rows split by kind: ``"5 failed: 3 for good (validation,
    truncated, refused…), 2 retryable (rate limit, server error, timeout…)"``. A row failed
    for good (an answer that missed its schema or was cut at the token limit, a refusal, a
    bad row) would get the same answer again, paid again; a retryable one may succeed on
    ``mmirage retry``."""
    if failed <= 0:
        return "0 failed"
    retryable = min(max(retryable, 0), failed)
    counts = (failed - retryable, retryable)
    parts = [f"{n} {kind} ({why})" for n, (kind, why) in zip(counts, _KINDS, strict=True) if n]
    return f"{failed} failed: {', '.join(parts)}"
