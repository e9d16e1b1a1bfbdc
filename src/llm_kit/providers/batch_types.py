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

    PENDING = "pending"
    """Accepted, being validated or queued."""
    IN_PROGRESS = "in_progress"
    """Requests are being answered."""
    FINALIZING = "finalizing"
    """All answered; the results are being prepared."""
    CANCELING = "canceling"
    """A cancel was asked for and is under way."""
    COMPLETED = "completed"
    """Ended; results can be fetched (some requests may still have failed one by one)."""
    FAILED = "failed"
    """Ended in failure as a whole (e.g. its input file was refused)."""
    EXPIRED = "expired"
    """Ended at the provider's deadline; the requests not answered by then did not run."""
    CANCELED = "canceled"
    """Ended by a cancel; what finished before stays fetchable."""

    @property
    def is_terminal(self) -> bool:
        """Whether the batch has ended (completed, failed, expired or canceled)."""
        return self in _TERMINAL


_TERMINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.EXPIRED, JobState.CANCELED})


@dataclass
class BatchCounts:
    """How the requests of a batch (or of a whole job, summed with ``+``) stand."""

    total: int = 0
    """Requests in all."""
    succeeded: int = 0
    """Requests answered successfully."""
    errored: int = 0
    """Requests that failed (for a job: items rejected before upload too)."""
    expired: int = 0
    """Requests the provider did not run before the batch expired."""
    canceled: int = 0
    """Requests not run because the batch was canceled."""
    processing: int = 0
    """Requests not answered yet."""

    def __add__(self, other: BatchCounts) -> BatchCounts:
        return BatchCounts(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))


def _values(counts: BatchCounts) -> tuple[int, ...]:
    return tuple(asdict(counts).values())


@dataclass
class ProviderBatch:
    """One batch at the provider; ``indices`` are the manifest positions of its items."""

    id: str
    """The provider's batch id."""
    first: int
    """The batch holds items `first .. first + count - 1` of the manifest, unless `indices` is
    set."""
    count: int
    """How many items the batch holds."""
    indices: list[int] | None = None
    """The manifest positions of a resubmission's scattered items; `None`: the range above."""
    input_file_id: str | None = None
    """The uploaded input file (OpenAI, Gemini)."""
    output_file_id: str | None = None
    """The results file, once the provider has written it (OpenAI, Gemini)."""
    error_file_id: str | None = None
    """The file of failed requests (OpenAI)."""
    results_url: str | None = None
    """Where the results are downloaded from (Anthropic)."""
    state: JobState = JobState.PENDING
    """The state as last seen."""
    provider_status: str | None = None
    """The provider's own word for the state, as last seen."""
    counts: BatchCounts = field(default_factory=BatchCounts)
    """The requests' counts as last seen."""
    errors: list[str] = field(default_factory=list)
    """Whole-batch errors the provider gave."""
    bytes: int = 0
    """The size of the batch's uploaded requests, in bytes."""
    created_at: float = field(default_factory=time.time)
    """When the batch was created (Unix seconds)."""

    def item_indices(self) -> range | list[int]:
        """The manifest positions of the batch's items."""
        return (
            self.indices if self.indices is not None else range(self.first, self.first + self.count)
        )

    def to_json(self) -> dict[str, Any]:
        """The batch as a JSON-ready dict (its entry in the job file)."""
        data = asdict(self)
        data["state"] = self.state.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProviderBatch:
        """The batch from its ``to_json`` dict."""
        data = dict(data)
        data["state"] = JobState(data["state"])
        data["counts"] = BatchCounts(**data.get("counts", {}))
        return cls(**data)


__all__ = ["BatchCounts", "JobState", "ProviderBatch"]
