"""`BatchJob`: the portable handle of a provider batch job. The handle is the checkpoint.

It names the provider, model and endpoint, every provider batch and file id, and a manifest of
the items (the item id behind each custom_id, and each item's metadata), so that another process
with only the key in its environment can poll, fetch, cancel or resubmit. It never holds a key.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from llm_kit.errors import ConfigError
from llm_kit.hosts import host_port
from llm_kit.providers.batch_types import BatchCounts, JobState, ProviderBatch

FORMAT = "llm_kit.batch_job"
VERSION = 1


# When batches of one job end differently, the job reports the most telling outcome.
_PRECEDENCE = (JobState.CANCELED, JobState.EXPIRED, JobState.FAILED, JobState.COMPLETED)
_ORDER = (JobState.PENDING, JobState.IN_PROGRESS, JobState.FINALIZING, JobState.CANCELING)


@dataclass
class BatchJobStatus:
    """What ``poll_batch`` answers: the job's state, its requests' counts, each batch's state.
    ``str(status)`` is a one-line summary."""

    state: JobState
    """The job's state: the least advanced of its running batches; once all have ended, the
    most telling outcome (`canceled`, `expired`, `failed`, then `completed`)."""
    counts: BatchCounts
    """The requests' counts over every batch, items rejected before upload counted as
    errored."""
    batches: list[tuple[str, JobState]] = field(default_factory=list)
    """`(provider batch id, state)` of each batch."""

    def __str__(self) -> str:
        c = self.counts
        return (
            f"{self.state.value}: {c.succeeded}/{c.total} succeeded, {c.errored} errored, "
            f"{c.expired} expired, {c.canceled} canceled, {c.processing} processing "
            f"({len(self.batches)} provider batches)"
        )


@dataclass
class Intent:
    """A batch creation that started and has not been answered yet, saved before the call:
    a later process finds the batch by it (``llm_kit.batch.orphans``) instead of paying for
    the chunk again. ``since`` is when the call was about to start (Unix seconds)."""

    tag: str
    path: str  # the chunk's spool file
    first: int
    count: int
    bytes: int = 0
    indices: list[int] | None = None
    since: float = field(default_factory=time.time)


@dataclass
class BatchJob:
    """A provider batch job: what was submitted, where, and what came of it so far.

    Made by ``LLM.submit_batch``; ``save`` and ``load`` carry it to another process.
    """

    provider: str
    """The provider (`openai`, `anthropic`, `gemini` ...), as `message_format` names it."""
    model: str
    """The model the requests name."""
    endpoint: str
    """The provider endpoint the requests target (e.g. `/v1/chat/completions`)."""
    base_url: str
    """The API's base URL (saved without credentials or query)."""
    item_ids: list[str]
    """The manifest: `item_ids[n]` is the item behind custom_id `str(n)`."""
    metadata: dict[int, Any] = field(default_factory=dict)
    """Manifest position to the item's metadata (only items that had some); restored on the
    results."""
    rejected: dict[int, str] = field(default_factory=dict)
    """Items that could not become a request at all (an unreadable image, say), with the
    reason: they are never uploaded and come back as failed results."""
    batches: list[ProviderBatch] = field(default_factory=list)
    """The provider batches, resubmissions included."""
    spool_dir: str | None = None
    """Where the request lines were written, for resubmission."""
    created_at: float = field(default_factory=time.time)
    """When the job was made (Unix seconds)."""
    version: int = VERSION
    """The job file's format version."""
    intents: list[Intent] = field(default_factory=list)
    """Batch creations that started and were not answered yet: a later call finds those
    batches at the provider instead of paying for them again."""
    keep_spool: bool = False
    """Keep the spool whole after the results are fetched (by default it is cut down to the
    requests of retryable failures, those `resubmit_failed` may send again)."""

    @property
    def batch_ids(self) -> list[str]:
        """The provider batch ids, in creation order."""
        return [b.id for b in self.batches]

    def status(self) -> BatchJobStatus:
        """The job's status from what its batches last reported (no network)."""
        counts = BatchCounts()
        for batch in self.batches:
            counts = counts + batch.counts
        counts.total += len(self.rejected)
        counts.errored += len(self.rejected)
        states = [b.state for b in self.batches]
        return BatchJobStatus(job_state(states), counts, [(b.id, b.state) for b in self.batches])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the handle atomically (a crash leaves the old file or the new one, whole)."""
        target = Path(path)
        data = {
            "format": FORMAT,
            "version": self.version,
            "provider": self.provider,
            "model": self.model,
            "endpoint": self.endpoint,
            "base_url": public_url(self.base_url),
            "created_at": self.created_at,
            "spool_dir": self.spool_dir,
            "keep_spool": self.keep_spool,
            "batches": [b.to_json() for b in self.batches],
            "intents": [asdict(i) for i in self.intents],
            "item_ids": self.item_ids,
            "metadata": {str(k): v for k, v in self.metadata.items()},
            "rejected": {str(k): v for k, v in self.rejected.items()},
        }
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(orjson.dumps(data))
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BatchJob:
        """Read a handle that ``save`` wrote.

        Raises:
            ConfigError: the file is missing, is not a job file, is damaged, or was written by
                a newer llm_kit.
        """
        source = Path(path)
        try:
            data = orjson.loads(source.read_bytes())
        except FileNotFoundError:
            raise ConfigError(f"job file {source} does not exist") from None
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"job file {source} is not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ConfigError(f"{source} is not an llm_kit batch job file")
        if data.get("version", 0) > VERSION:
            raise ConfigError(
                f"{source} was written by a newer llm_kit (job format {data['version']}, this "
                f"version reads up to {VERSION}); upgrade llm_kit to read it"
            )
        try:
            return cls(
                provider=data["provider"],
                model=data["model"],
                endpoint=data["endpoint"],
                base_url=data["base_url"],
                item_ids=data["item_ids"],
                metadata={int(k): v for k, v in data.get("metadata", {}).items()},
                rejected={int(k): v for k, v in data.get("rejected", {}).items()},
                batches=[ProviderBatch.from_json(b) for b in data["batches"]],
                spool_dir=data.get("spool_dir"),
                keep_spool=bool(data.get("keep_spool", False)),
                created_at=data.get("created_at", 0.0),
                version=data.get("version", VERSION),
                intents=[Intent(**i) for i in data.get("intents", [])],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"job file {source} is incomplete or damaged ({exc})") from None


def job_state(states: list[JobState]) -> JobState:
    if not states:
        return JobState.COMPLETED  # every item was rejected locally: nothing is running
    running = [s for s in states if not s.is_terminal]
    if running:
        return min(running, key=_ORDER.index)
    if all(s is JobState.FAILED for s in states):
        return JobState.FAILED
    return next(s for s in _PRECEDENCE if s in states)


def public_url(url: str) -> str:
    """The URL without credentials or query (a key can hide in either)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, host_port(parts), parts.path, "", ""))
