"""The chunks an interrupted ``mmirage retry`` left behind, settled before the next one.

A retry stopped (Ctrl-C, SIGTERM, SIGKILL, a full disk) while it created a batch leaves, in
``<state>/batch/retry-<run_id>/<processor>/<modality>/``, a chunk with an intent and no
``.done``. The next retry asks the provider for the batch carrying the intent's tag: found, it
is adopted (its receipt written under the interrupted retry's run id, so its requests count as
resubmitted and are not paid for again); not found, the intent is abandoned and the chunk's
requests, still failed, are resubmitted like any others. A chunk whose ``.done`` exists but
whose receipt line may be missing gets that line written again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from mmirage.core.process.batch.collector import AdapterPool, CollectorError, one_sentence
from mmirage.core.process.batch.creation import ChunkCreator
from mmirage.core.process.batch.intents import abandon_intent, read_intent, record_receipt
from mmirage.core.process.batch.receipts import (
    append_receipt,
    batch_processors,
    chunk_receipt,
    receipt_path,
    redact,
)
from mmirage.core.process.batch.results_store import BatchRecord
from mmirage.core.process.batch.spool import SpooledChunk, read_lines

if TYPE_CHECKING:
    from mmirage.config.batch_provider import BatchProviderConfig
    from mmirage.config.models import MMirageConfig
    from mmirage.core.process.batch.adapter import BatchSubmissionAdapter
    from mmirage.rundir import RunDir

logger = logging.getLogger(__name__)

RETRY_PREFIX = "retry-"


def retry_receipt(
    adapter: BatchSubmissionAdapter,
    config: BatchProviderConfig,
    chunk: SpooledChunk,
    raw: dict[str, Any],
    *,
    chunk_id: str,
    modality: str | None,
    processor: str,
    run_id: str,
    run_dir: RunDir,
    retry_of: Sequence[str],
) -> dict[str, Any]:
    """The receipt of a retry's chunk; its shard fields are null (a retry chunk may hold
    requests of every shard) and ``retry_of`` names the batches its requests came from."""
    lines = read_lines(chunk)
    result = adapter.parse_submission_result(raw)
    receipt = chunk_receipt(
        config,
        chunk,
        lines,
        list(chunk.read_ids()),
        chunk_id=chunk_id,
        batch_id=result.provider_batch_id,
        status=result.status,
        raw=redact(raw, adapter.credentials.values()),
        modality=modality,
        processor=processor,
        run_id=run_id,
        shard_id=None,
        num_shards=None,
        pipeline_id=run_dir.pipeline_id,
        fingerprint=run_dir.fingerprint,
    )
    receipt["retry_of"] = list(retry_of)
    return receipt


def settle_interrupted_retries(
    config: MMirageConfig,
    run_dir: RunDir,
    pool: AdapterPool,
    creator: ChunkCreator,
) -> int:
    """Adopt or abandon every chunk an earlier retry was creating when it stopped; returns
    how many batches were adopted."""
    processors = {p.name or p.type: p for p in batch_processors(config)}
    adopted = 0
    for path in sorted(run_dir.batch_dir().glob(f"{RETRY_PREFIX}*/*/*/chunk-*.jsonl")):
        chunk = SpooledChunk(int(path.stem.removeprefix("chunk-")), path)
        modality, name = path.parent.name, path.parent.parent.name
        processor = processors.get(name)
        if processor is None:
            continue  # a processor since removed from the config: its receipts say so
        pc = processor.provider_config
        run_id = path.parent.parent.parent.name.removeprefix(RETRY_PREFIX)
        receipts = receipt_path(run_dir.receipt_base(name), modality, run_id)
        if chunk.done_path.exists():
            if not chunk.receipted_path.exists():  # stopped between the two writes
                append_receipt(receipts, orjson.loads(chunk.done_path.read_bytes()))
                chunk.receipted_path.touch()
            continue
        intent = read_intent(chunk)
        if intent is None:
            continue  # never sent: its requests are still failed, and resubmitted
        adapter, pc = pool.adapter_for(BatchRecord(pc.provider, "", processor=name))
        chunk.count = sum(1 for _ in chunk.read_ids())
        chunk.bytes = path.stat().st_size
        requests = [orjson.loads(line) for line in read_lines(chunk)]
        try:
            found = creator.adopt(adapter, pc, chunk, intent, requests, intent.chunk_id)
        except Exception as exc:
            raise CollectorError(
                f"looking for the batch that an interrupted retry created from {path} failed "
                f"({one_sentence(exc, adapter)}); nothing was resubmitted, run 'mmirage retry' "
                "again"
            ) from None
        if found is None:
            abandon_intent(chunk)
            continue
        receipt = retry_receipt(
            adapter,
            pc,
            chunk,
            found,
            chunk_id=intent.chunk_id,
            modality=modality,
            processor=name,
            run_id=run_id,
            run_dir=run_dir,
            retry_of=intent.retry_of,
        )
        record_receipt(chunk, receipt, receipts)
        adopted += 1
    return adopted
