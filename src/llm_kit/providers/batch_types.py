"""What a batch backend answers in: one state vocabulary, counts, one batch at the provider.

Provider modules and llm_kit.batch's orchestration both speak it, so it lives with the
providers and the orchestration imports it (never the other way round).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    """One vocabulary for every provider's batch states."""

    PENDING = "pending"  # accepted, validating or queued
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    CANCELING = "canceling"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELED = "canceled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.EXPIRED, JobState.CANCELED})


@dataclass
class BatchCounts:
    total: int = 0
    succeeded: int = 0
    errored: int = 0
    expired: int = 0
    canceled: int = 0
    processing: int = 0

    def __add__(self, other: BatchCounts) -> BatchCounts:
        return BatchCounts(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))


def _values(counts: BatchCounts) -> tuple[int, ...]:
    return tuple(asdict(counts).values())


@dataclass
class ProviderBatch:
    """One batch at the provider; ``indices`` are the manifest positions of its items."""

    id: str
    first: int  # items first..first+count-1 of the manifest, unless ``indices`` is set
    count: int
    indices: list[int] | None = None  # a resubmission holds a scattered set of items
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    results_url: str | None = None
    state: JobState = JobState.PENDING
    provider_status: str | None = None  # the provider's own word for the state, as last seen
    counts: BatchCounts = field(default_factory=BatchCounts)
    errors: list[str] = field(default_factory=list)  # whole-batch errors the provider gave
    bytes: int = 0
    created_at: float = field(default_factory=time.time)

    def item_indices(self) -> range | list[int]:
        return (
            self.indices if self.indices is not None else range(self.first, self.first + self.count)
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProviderBatch:
        data = dict(data)
        data["state"] = JobState(data["state"])
        data["counts"] = BatchCounts(**data.get("counts", {}))
        return cls(**data)


__all__ = ["BatchCounts", "JobState", "ProviderBatch"]
