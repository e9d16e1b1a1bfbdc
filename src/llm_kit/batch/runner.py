"""Provider batch jobs end to end: spool, submit, poll, fetch and reconcile, resubmit.

Custom ids are manifest positions ("0", "1", ...): legal for every provider, reversible through
``BatchJob.item_ids``, and cheap to map back when a million results come home.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from array import array
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from llm_kit.answers import judge
from llm_kit.batch.job import BatchJob, Intent, JobState, ProviderBatch
from llm_kit.batch.orphans import find_orphan, new_tag, settle
from llm_kit.errors import BatchNotFinishedError, ConfigError, ItemError
from llm_kit.pipeline import Items
from llm_kit.providers.base import Codec
from llm_kit.providers.batch_backend import BatchBackend, BatchLimits, Chunk, Outcome
from llm_kit.schema import response_schema
from llm_kit.types import BatchItem, BatchResult

logger = logging.getLogger(__name__)

_CREATE_CONCURRENCY = 4  # batches created at once: uploads are big, providers rate-limit creation


class Spooler:
    """Turns items into request lines in chunk files no larger than the provider allows.

    ``scattered`` chunks (resubmissions) list their manifest positions; first-time chunks hold
    a contiguous run and need only its start and length, until an item is rejected in the
    middle of one: from that gap on, the chunk lists its positions too.
    """

    def __init__(
        self, backend: BatchBackend, limits: BatchLimits, directory: Path, scattered: bool = False
    ) -> None:
        self.backend = backend
        self.limits = limits
        self.directory = directory
        self.scattered = scattered
        self.chunks: list[Chunk] = []
        self._file: Any = None

    def add(self, index: int, line: bytes) -> None:
        size = len(line)
        if size > self.limits.max_bytes:
            raise ItemError(
                f"the request is {size:,} bytes, more than a {self.backend.name} batch may hold "
                f"({self.limits.max_bytes:,})"
            )
        chunk = self.chunks[-1] if self.chunks else None
        if chunk is None or not self.limits.admits(chunk.count, chunk.bytes, line):
            chunk = self._open(index)
        assert chunk is not None
        if chunk.indices is None and index != chunk.first + chunk.count:  # a rejected item's gap
            chunk.indices = list(range(chunk.first, chunk.first + chunk.count))
        self._file.write(line)
        chunk.count += 1
        chunk.bytes += size
        if chunk.indices is not None:
            chunk.indices.append(index)

    def _open(self, index: int) -> Chunk:
        self.close()
        path = self.directory / f"requests-{len(self.chunks):05d}-{index}.jsonl"
        self._file = open(path, "wb")  # noqa: SIM115 - closed by close()
        chunk = Chunk(path=path, first=index, indices=[] if self.scattered else None)
        self.chunks.append(chunk)
        return chunk

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def spool(
    items: Iterable[BatchItem],
    *,
    backend: BatchBackend,
    codec: Codec,
    sampling: Mapping[str, Any],
    limits: BatchLimits,
    directory: Path,
    base_url: str,
    on_model: Callable[[BatchItem], None] | None = None,
) -> tuple[BatchJob, list[Chunk]]:
    """Build every request on disk first, so that a duplicate id stops the job before upload."""
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.glob("requests-*.jsonl")):
        raise ConfigError(
            f"spool directory {directory} already holds the requests of another job; "
            "remove it or pass another spool_dir"
        )
    job = BatchJob(
        provider=backend.name,
        model=backend.model,
        endpoint=backend.endpoint,
        base_url=base_url,
        item_ids=[],
        spool_dir=str(directory),
    )
    seen: set[str] = set()
    spooler = Spooler(backend, limits, directory)
    try:
        for index, item in enumerate(items):
            if item.id in seen:
                raise ConfigError(
                    f"duplicate item id {item.id!r}: ids must be unique in a batch job "
                    "(nothing was uploaded)"
                )
            seen.add(item.id)
            job.item_ids.append(item.id)
            if item.metadata:
                job.metadata[index] = item.metadata
            if item.response_model is not None and on_model is not None:
                on_model(item)
            try:
                line = _request_line(backend, codec, item, index, sampling)
                spooler.add(index, line)
            except ItemError as exc:
                job.rejected[index] = str(exc)
    except BaseException:
        spooler.close()
        for chunk in spooler.chunks:  # a refused job leaves no requests behind
            chunk.path.unlink(missing_ok=True)
        raise
    finally:
        spooler.close()
    if not job.item_ids:
        raise ConfigError("no items to submit: the item list is empty")
    return job, spooler.chunks


def _request_line(
    backend: BatchBackend, codec: Codec, item: BatchItem, index: int, sampling: Mapping[str, Any]
) -> bytes:
    try:
        schema = response_schema(item.response_model) if item.response_model else None
    except ItemError as exc:
        raise ConfigError(f"item {item.id!r}: {exc}") from None  # every such item would fail
    merged = {**sampling, **item.sampling} if item.sampling else sampling
    body = codec.encode(backend.model, item.messages, merged, schema)
    return backend.line(str(index), body)


async def create_batches(
    backend: BatchBackend,
    job: BatchJob,
    chunks: list[Chunk],
    on_created: Callable[[], None] | None = None,
) -> None:
    """Create one provider batch per chunk, a few at a time, adding each to ``job.batches`` as
    soon as the provider has it: if a later creation fails, the ones already paid for stay in
    the handle, and the items left out are reported as not submitted (and can be resubmitted).

    Before each call the chunk's intent (with its tag) joins ``job.intents`` and ``on_created``
    runs (to save the handle), so a crash mid-call leaves what ``adopt_orphans`` needs; a
    cancellation waits, bounded, for the calls in flight and records their batches.
    """
    gate = asyncio.Semaphore(_CREATE_CONCURRENCY)

    async def create(chunk: Chunk) -> None:
        async with gate:
            chunk.tag = chunk.tag or new_tag()
            intent = Intent(
                chunk.tag, str(chunk.path), chunk.first, chunk.count, chunk.bytes, chunk.indices
            )
            job.intents.append(intent)
            if on_created is not None:
                on_created()

            def record(batch: ProviderBatch) -> None:
                job.batches.append(batch)
                job.intents.remove(intent)
                if on_created is not None:
                    on_created()

            await settle(backend.create(chunk), record)

    # Every creation runs to its end even when another fails: one that reached the provider
    # must be in the handle, or a retry would pay for its items twice.
    outcomes = await asyncio.gather(*(create(c) for c in chunks if c.count), return_exceptions=True)
    cancelled = [o for o in outcomes if isinstance(o, asyncio.CancelledError)]
    if cancelled:
        raise cancelled[0]
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise errors[0]


async def adopt_orphans(backend: BatchBackend, job: BatchJob) -> int:
    """Settle the job's unanswered creations: each batch an earlier process created but never
    recorded joins ``job.batches``; an intent with no batch at the provider is dropped (its
    items are then "not_submitted", for ``resubmit_failed``). Returns how many were adopted."""
    adopted = 0
    for intent in list(job.intents):
        chunk = Chunk(
            Path(intent.path), intent.first, intent.count, intent.bytes, intent.indices, intent.tag
        )
        found = await find_orphan(backend, chunk, intent.since, known=set(job.batch_ids))
        if found is not None:
            logger.warning("adopted batch %s, created by an interrupted run", found[0].id)
            job.batches.append(found[0])
            adopted += 1
        job.intents.remove(intent)
    return adopted


async def refresh(backend: BatchBackend, job: BatchJob) -> None:
    """Poll every batch that has not ended yet."""
    running = [b for b in job.batches if not b.state.is_terminal]
    await asyncio.gather(*(backend.refresh(b) for b in running))


async def fetch(
    backend: BatchBackend,
    job: BatchJob,
    models: Mapping[str, type[BaseModel]],
    max_tokens: int | None = None,
) -> AsyncIterator[BatchResult]:
    """One BatchResult per item of the job (see ``outcomes``)."""
    async for _, result in outcomes(backend, job, models, max_tokens):
        yield result


async def outcomes(
    backend: BatchBackend,
    job: BatchJob,
    models: Mapping[str, type[BaseModel]],
    max_tokens: int | None = None,
) -> AsyncIterator[tuple[int, BatchResult]]:
    """(position, BatchResult) per item: its latest outcome, never a success overwritten.
    ``max_tokens``: the answers' token limit, named in a ``truncated`` failure when known.

    A result of an item that a later (resubmitted) batch also holds is skipped: the later batch
    decides. Items without any result end as errors that say why (batch failed, expired,
    canceled, or missing from the results).
    """
    running = [b.id for b in job.batches if not b.state.is_terminal]
    if running:
        raise BatchNotFinishedError(
            f"{len(running)} of the job's {len(job.batches)} batches are still running "
            f"({', '.join(running[:3])}); poll until status.state.is_terminal, then fetch"
        )
    size = len(job.item_ids)
    owner = array("i", [-1]) * size  # the batch whose outcome counts for each item
    for number, batch in enumerate(job.batches):
        for index in batch.item_indices():
            owner[index] = number
    seen = bytearray(size)
    with tempfile.TemporaryDirectory(prefix="llm_kit-results-") as tmp:
        for number, batch in enumerate(job.batches):
            async for outcome in backend.results(batch, Path(tmp)):
                try:
                    index = outcome.index
                except ValueError:
                    continue  # not one of ours: our custom_ids are manifest positions
                if not 0 <= index < size or owner[index] != number or seen[index]:
                    continue  # superseded, foreign or repeated
                seen[index] = 1
                yield index, _result(job, index, outcome, models, max_tokens)
    for index, reason in job.rejected.items():
        yield index, _failure(job, index, reason, "invalid_item", retryable=False)
    for number, batch in enumerate(job.batches):
        kind, why = _missing_reason(batch)
        for index in batch.item_indices():
            if owner[index] == number and not seen[index]:
                yield index, _failure(job, index, why, kind, retryable=True)
    # Items no batch holds: their batch's creation failed (e.g. the connection dropped).
    for index in range(size):
        if owner[index] == -1 and index not in job.rejected:
            reason = "this request was never submitted (its batch could not be created)"
            yield index, _failure(job, index, reason, "not_submitted", retryable=True)


def _missing_reason(batch: ProviderBatch) -> tuple[str, str]:
    if batch.state is JobState.FAILED:
        errors = "; ".join(batch.errors) or "no reason given"
        return "batch_failed", f"batch {batch.id} failed at the provider: {errors}"
    if batch.state is JobState.EXPIRED:
        return "expired", f"batch {batch.id} expired before this request ran"
    if batch.state is JobState.CANCELED:
        return "canceled", f"batch {batch.id} was canceled before this request ran"
    return "missing", f"batch {batch.id} ended without a result for this request"


def _result(
    job: BatchJob,
    index: int,
    outcome: Outcome,
    models: Mapping[str, type[BaseModel]],
    max_tokens: int | None,
) -> BatchResult:
    item_id = job.item_ids[index]
    if outcome.completion is None:
        return _failure(
            job, index, outcome.error or "failed", outcome.kind or "errored", outcome.retryable
        )
    completion = outcome.completion
    # The live pipeline's judgement: a batch has no turn to re-ask in, so a miss is final.
    verdict = judge(completion, models.get(item_id), max_tokens)
    if not verdict.ok:  # truncated, validation, refusal: a resubmission buys the same answer
        result = _failure(job, index, verdict.error or "", verdict.kind or "validation", False)
        result.usage, result.finish_reason = completion.usage, completion.finish_reason
        return result
    return BatchResult(
        item_id,
        True,
        verdict.response,
        usage=completion.usage,
        metadata=job.metadata.get(index) or {},
        finish_reason=completion.finish_reason,
    )


def _failure(job: BatchJob, index: int, error: str, kind: str, retryable: bool) -> BatchResult:
    return BatchResult(
        job.item_ids[index],
        False,
        error=error,
        error_kind=kind,
        retryable=retryable,
        metadata=job.metadata.get(index) or {},
    )


def respool(
    job: BatchJob,
    indices: set[int],
    *,
    backend: BatchBackend,
    limits: BatchLimits,
    directory: Path,
    items: Iterable[BatchItem] | None,
    codec: Codec,
    sampling: Mapping[str, Any],
) -> list[Chunk]:
    """Request lines for the given manifest positions: rebuilt from ``items`` when given, else
    copied from the job's spool files (so a resubmission needs no items in the same process)."""
    directory.mkdir(parents=True, exist_ok=True)
    spooler = Spooler(backend, limits, directory, scattered=True)
    wanted = set(indices)
    try:
        if items is not None:
            position = {item_id: n for n, item_id in enumerate(job.item_ids)}
            for item in items:
                index = position.get(item.id)
                if index in wanted:
                    spooler.add(index, _request_line(backend, codec, item, index, sampling))
                    wanted.discard(index)
        elif job.spool_dir and Path(job.spool_dir).is_dir():
            for path in sorted(Path(job.spool_dir).glob("requests-*.jsonl")):
                with open(path, "rb") as f:
                    for line in f:
                        record = orjson.loads(line)
                        index = int(record.get("custom_id", record.get("key")))
                        if index in wanted:
                            spooler.add(index, line)
                            wanted.discard(index)
    finally:
        spooler.close()
    if wanted:
        raise ConfigError(
            f"{len(wanted)} item(s) to resubmit have no request to rebuild from: pass items=... "
            "(the job's spool files are gone or were written on another machine)"
        )
    return spooler.chunks


def models_of(items: Items | None) -> dict[str, type[BaseModel]]:
    """{item id: response_model} for the items that have one (only those cost memory)."""
    if items is None or not isinstance(items, Iterable):
        return {}
    return {i.id: i.response_model for i in items if i.response_model is not None}
