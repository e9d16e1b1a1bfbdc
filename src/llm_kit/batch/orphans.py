"""Never pay twice for one batch creation.

A creation can be lost in two windows: a stop (Ctrl-C, SIGTERM, a cancelled task) while the
call is in flight, and a crash after the provider accepted the batch but before its id was
saved. ``settle`` closes the first: the call is given a bounded time to answer and its batch is
recorded before the stop goes on. ``find_orphan`` closes the second: the caller saves an
intent (the chunk and its tag) before the call, and before creating that chunk again looks
among the provider's batches for the one the earlier call made.

Where the provider can label a batch (OpenAI metadata, Gemini display name) the tag finds it
exactly. Anthropic message batches have no label: a candidate is a batch created after the
intent (less ``CLOCK_SKEW_S``), of the chunk's size, that no saved handle names; an ended one
must also return only the chunk's custom_ids. If several running candidates remain,
``OrphanBatchUnclearError`` is raised rather than a guess (nothing is created).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson

from llm_kit.batch.job import ProviderBatch
from llm_kit.errors import OrphanBatchUnclearError
from llm_kit.providers.batch_backend import BatchBackend, Chunk

logger = logging.getLogger(__name__)

T = TypeVar("T")

CLOCK_SKEW_S = 300.0  # the provider's clock may be behind ours by this much
STOP_GRACE_S = 120.0  # how long a stop waits for a creation in flight to answer


def new_tag() -> str:
    """A label no other batch carries (it fits OpenAI metadata and a Gemini display name)."""
    return f"llm_kit-{uuid.uuid4().hex}"


async def settle(
    creation: Awaitable[T], record: Callable[[T], None], grace: float = STOP_GRACE_S
) -> None:
    """Await ``creation`` and ``record`` its result. Cancelled meanwhile, the call still gets up
    to ``grace`` seconds to answer (the provider may already hold the batch), its result is
    recorded, and only then does the cancellation go on."""
    task = asyncio.ensure_future(creation)
    try:
        result = await asyncio.shield(task)
    except asyncio.CancelledError:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while not task.done() and loop.time() < deadline:
            try:
                await asyncio.wait({task}, timeout=deadline - loop.time())
            except asyncio.CancelledError:
                continue  # a second cancel (the loop shutting down) must not cut the wait short
        if not task.done():
            task.cancel()
            logger.warning(
                "a batch creation did not answer within %.0f s of the stop; the saved intent "
                "lets the next run find the batch instead of paying for it again",
                grace,
            )
        elif not task.cancelled() and task.exception() is None:
            record(task.result())
        raise
    record(result)


async def find_orphan(
    backend: BatchBackend,
    chunk: Chunk,
    since: float,
    known: Collection[str] = (),
) -> tuple[ProviderBatch, Mapping[str, Any]] | None:
    """The batch an earlier, unanswered creation of ``chunk`` left at the provider, or None
    when there is none (then creating it is safe). ``since``: when that creation was about to
    start (Unix seconds); ``known``: batch ids already recorded somewhere, never adopted."""
    listed = backend.listed(since - CLOCK_SKEW_S)
    if backend.tags_batches:
        if chunk.tag is None:
            return None
        async for batch, data in listed:
            if backend.tag_of(data) == chunk.tag:
                return _adopted(backend, chunk, batch, data)
        return None
    running: list[tuple[ProviderBatch, Mapping[str, Any]]] = []
    ended: list[tuple[ProviderBatch, Mapping[str, Any]]] = []
    async for batch, data in listed:
        if batch.id in known or batch.counts.total != chunk.count:
            continue
        (ended if batch.state.is_terminal else running).append((batch, data))
    ids = _custom_ids(chunk.path)
    for batch, data in ended:
        if await _holds_only(backend, batch, ids):
            return _adopted(backend, chunk, batch, data)
    if len(running) == 1:
        return _adopted(backend, chunk, *running[0])
    if running:
        names = ", ".join(b.id for b, _ in running[:3])
        raise OrphanBatchUnclearError(
            f"{len(running)} running {backend.name} batches ({names}) of {chunk.count} requests "
            f"were created after the unanswered creation of {chunk.path.name}, and a "
            f"{backend.name} batch carries no tag to tell which is its own; nothing was "
            "created: run again once they have ended (their results name their requests)"
        )
    return None


def _adopted(
    backend: BatchBackend, chunk: Chunk, found: ProviderBatch, data: Mapping[str, Any]
) -> tuple[ProviderBatch, Mapping[str, Any]]:
    batch = chunk.batch(found.id, input_file_id=found.input_file_id)
    backend.apply(batch, data)
    logger.info(
        "found %s batch %s: an interrupted creation of %s made it",
        backend.name,
        batch.id,
        chunk.path.name,
    )
    return batch, data


def _custom_ids(path: Path) -> set[str]:
    ids: set[str] = set()
    if not path.is_file():
        return ids  # the spool is gone: no ended batch can be shown to be this chunk's
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                record = orjson.loads(line)
                ids.add(str(record.get("custom_id", record.get("key"))))
    return ids


async def _holds_only(backend: BatchBackend, batch: ProviderBatch, ids: set[str]) -> bool:
    """Whether the ended batch returned results, all of them for ``ids``."""
    seen = False
    with tempfile.TemporaryDirectory(prefix="llm_kit-orphan-") as tmp:
        async for outcome in backend.results(batch, Path(tmp)):
            if outcome.custom_id not in ids:
                return False
            seen = True
    return seen
