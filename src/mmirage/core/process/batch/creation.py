"""One chunk's batch creation, paid for at most once: shared by ``mmirage run`` (the
``batch_api`` processor) and ``mmirage retry`` (``resubmit``).

``ChunkCreator.create`` writes the chunk's intent (``intents.py``) before the adapter is
called; a chunk that has one already (its earlier creation was interrupted) is first looked
for at the provider (``adopt``) and created, with the same tag, only when the provider has no
batch of it. ``run_through_stop`` runs a creation in a thread that a Ctrl-C or SIGTERM does not
cut short: the stop waits (at most ``STOP_GRACE_S``) for the batch and its receipt.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mmirage.core.process.batch.intents import Intent, read_intent, recorded_batch_ids, write_intent

if TYPE_CHECKING:
    from mmirage.config.batch_provider import BatchProviderConfig
    from mmirage.core.process.batch.adapter import BatchSubmissionAdapter
    from mmirage.core.process.batch.spool import SpooledChunk

logger = logging.getLogger(__name__)

T = TypeVar("T")

STOP_GRACE_S = 120.0  # how long a stop waits for a creation in flight to be recorded


class ChunkCreator:
    """Creates or adopts chunks' batches; ``batch_root`` (``<state>/batch``) holds every
    ``.done`` marker, whose batches are never adopted for another chunk."""

    def __init__(self, batch_root: Path) -> None:
        self.batch_root = batch_root
        self._lookup = threading.Lock()  # one orphan lookup at a time: never one batch twice
        self._claimed: set[str] = set()  # batch ids this process created or adopted

    def create(
        self,
        adapter: BatchSubmissionAdapter,
        config: BatchProviderConfig,
        chunk: SpooledChunk,
        chunk_id: str,
        requests: Sequence[dict[str, Any]],
        **details: Any,
    ) -> dict[str, Any]:
        """The provider's answer for the chunk's batch: adopted when an interrupted run had
        created it already, else created now (its intent, with ``details``, on disk first)."""
        intent = read_intent(chunk)
        if intent is None:
            intent = write_intent(chunk, chunk_id=chunk_id, **details)
        else:
            found = self.adopt(adapter, config, chunk, intent, requests, chunk_id)
            if found is not None:
                return found
        raw = adapter.submit_tagged_chunk(chunk_id, intent.tag, requests, config)
        self._claimed.add(adapter.parse_submission_result(raw).provider_batch_id)
        return raw

    def adopt(
        self,
        adapter: BatchSubmissionAdapter,
        config: BatchProviderConfig,
        chunk: SpooledChunk,
        intent: Intent,
        requests: Sequence[dict[str, Any]],
        chunk_id: str,
    ) -> dict[str, Any] | None:
        """The batch the interrupted creation behind ``intent`` left at the provider (its raw
        answer), or None when the provider has none."""
        with self._lookup:
            known = recorded_batch_ids(self.batch_root) | self._claimed
            found = adapter.find_submitted_chunk(
                chunk_id, intent.tag, requests, intent.since, known, config
            )
            if found is None:
                return None
            batch_id = adapter.parse_submission_result(found).provider_batch_id
            self._claimed.add(batch_id)
        logger.warning(
            "%s: adopted %s batch %s, created by an interrupted run (not paid again)",
            chunk.path,
            config.provider,
            batch_id,
        )
        return found


def run_through_stop(work: Callable[[], T], grace: float = STOP_GRACE_S) -> T:
    """``work()`` in a worker thread. A stop (KeyboardInterrupt, SystemExit from SIGTERM)
    while it runs waits up to ``grace`` seconds for it, since the provider may already hold
    the batch it creates and its receipt is written by that thread, then goes on."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def target() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(work())
        except BaseException as exc:
            future.set_exception(exc)

    # A daemon: a creation that never answers must not keep the process alive past the grace.
    threading.Thread(target=target, name="batch-create", daemon=True).start()
    try:
        return future.result()
    except (KeyboardInterrupt, SystemExit):
        if not future.done():
            logger.warning(
                "stopping: waiting up to %.0f s for the batch creation in flight, so that its "
                "receipt is written",
                grace,
            )
            deadline = time.monotonic() + grace
            while not future.done() and time.monotonic() < deadline:
                try:
                    concurrent.futures.wait([future], timeout=deadline - time.monotonic())
                except (KeyboardInterrupt, SystemExit):
                    continue  # a second stop must not cut the wait short
        raise
