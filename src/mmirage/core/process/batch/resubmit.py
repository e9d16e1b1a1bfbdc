"""``mmirage retry`` in batch mode: resubmit exactly the requests that did not succeed.

A request is resubmitted when its latest outcome (see ``results_store``) is ``failed``,
``expired``, ``canceled`` or ``missing`` from a terminal batch — never when it succeeded or its
latest batch is still running, so a retry can be run at any time without paying twice. With
``only_retryable`` the requests the provider marked non-retryable (an invalid request, say)
are left alone.

The request lines are read back from the receipts' ``spool_path`` files (streamed and filtered
by custom_id: the exact bytes that were submitted, so the ``custom_id`` and the placeholders in
the shards stay the same), chunked again with the processor's caps by a ``spool.ChunkSpool`` in
``<state>/batch/retry-<run_id>/<processor>/<modality>/``, and submitted as they fill. Each new
batch gets a receipt in the usual file (``<base>.<modality>.<run_id>.jsonl``, new run id) with
``retry_of`` naming the batches its requests came from; the next ``merge`` fetches it and takes
its successes.

A resubmission is paid for at most once, as ``mmirage run``'s submission (``creation.py``):
each chunk's intent is on disk before its batch is created, a stop waits for the creation in
flight and its receipt, and the next retry first adopts what an interrupted one created
(``retry_adoption.py``).
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from mmirage.core.process.batch.collector import (
    AdapterPool,
    CollectorError,
    one_sentence,
    open_store,
    receipt_files,
    scan_receipts,
)
from mmirage.core.process.batch.creation import ChunkCreator, run_through_stop
from mmirage.core.process.batch.fetching import FetchReport, fetch_terminal
from mmirage.core.process.batch.intents import record_receipt
from mmirage.core.process.batch.receipts import receipt_path
from mmirage.core.process.batch.results_store import BatchRecord, ResultsStore
from mmirage.core.process.batch.retry_adoption import (
    RETRY_PREFIX,
    retry_receipt,
    settle_interrupted_retries,
)
from mmirage.core.process.batch.spool import ChunkSpool, SpooledChunk, read_lines
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

_FEED = 1000  # request lines handed to the spool at a time: memory stays one chunk's worth


@dataclass
class RetryReport:
    run_id: str
    fetch: FetchReport
    by_reason: Counter[str] = field(default_factory=Counter)  # resubmitted requests
    new_batches: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)  # one sentence per spool file that is gone

    @property
    def resubmitted(self) -> int:
        return sum(self.by_reason.values())


def retry_failed(
    config: MMirageConfig,
    run_dir: RunDir,
    *,
    only_retryable: bool = False,
    run_id: str | None = None,
) -> RetryReport:
    """Refresh the store (fetch every terminal batch), then resubmit what did not succeed."""
    run_id = run_id or uuid.uuid4().hex[:6]
    with _retry_lock(run_dir), open_store(run_dir) as store:
        pool = AdapterPool(config)
        resubmitter = _Resubmitter(run_dir, pool, run_id)
        # First the batches an interrupted retry created: their requests are not failed.
        settle_interrupted_retries(config, run_dir, pool, resubmitter.creator)
        key = pool.pipeline_key(run_dir)
        scan = scan_receipts(
            receipt_files(run_dir, config_path=str(config.config_path)), store, only=key
        )
        pool.check_providers(scan.records)
        report = resubmitter.report = RetryReport(run_id, fetch_terminal(store, pool, scan.records))
        failed = store.failed_requests(only_retryable=only_retryable)
        for (provider, batch_id), group in itertools.groupby(failed, key=lambda t: t[:2]):
            record = store.batch(provider, batch_id)
            assert record is not None  # failed_requests lists known batches only
            resubmitter.add(store, record, {cid for _, _, cid in group})
        resubmitter.finish()
    return report


@dataclass
class _Target:
    """Where resubmitted requests of one (processor, modality) go."""

    record: BatchRecord  # a batch they come from: names the processor, provider, modality
    spool: ChunkSpool
    origins: dict[str, str] = field(default_factory=dict)  # custom_id → old batch id


class _Resubmitter:
    report: RetryReport

    def __init__(self, run_dir: RunDir, pool: AdapterPool, run_id: str) -> None:
        self.pool = pool
        self.run_id = run_id
        self.run_dir = run_dir
        self.root = run_dir.batch_dir() / f"{RETRY_PREFIX}{run_id}"
        self.creator = ChunkCreator(run_dir.batch_dir())
        self._targets: dict[tuple[str, str], _Target] = {}
        self._chunks = itertools.count(1)

    def add(self, store: ResultsStore, record: BatchRecord, wanted: set[str]) -> None:
        """Spool the ``wanted`` requests of ``record``'s batch (and submit full chunks)."""
        source = Path(record.spool_path or "")
        if (
            not record.spool_path
            or not source.is_file()
            or not source.with_suffix(".ids").is_file()
        ):
            self.report.lost.append(
                f"the request lines of batch {record.batch_id} ({record.spool_path or 'no path'}) "
                f"are gone, so its {len(wanted)} unfinished request(s) cannot be resubmitted"
            )
            return
        target = self._target(record)
        states = store.lookup(sorted(wanted))
        pending: list[tuple[str, int, int, bytes]] = []
        found = 0
        for request in _lines(SpooledChunk(0, source), wanted):
            found += 1
            self.report.by_reason[states[request[0]].state] += 1
            target.origins[request[0]] = record.batch_id
            pending.append(request)
            if len(pending) >= _FEED:
                self._spool(target, pending)
                pending = []
        self._spool(target, pending)
        if found < len(wanted):
            self.report.lost.append(
                f"{len(wanted) - found} unfinished request(s) of batch {record.batch_id} are not "
                f"in its request lines ({source}), so they cannot be resubmitted"
            )

    def finish(self) -> None:
        for target in self._targets.values():
            for chunk in target.spool.close():
                self._submit(target, chunk)

    def _target(self, record: BatchRecord) -> _Target:
        processor = self.pool.processor_for(record)
        modality = record.modality or "text"
        key = (processor.name or processor.type, modality)
        target = self._targets.get(key)
        if target is None:
            adapter, pc = self.pool.adapter_for(record)
            cap = pc.max_requests_per_chunk or getattr(adapter, "max_requests_per_batch", None)
            directory = self.root / key[0] / modality
            spool = ChunkSpool(directory, pc.max_chunk_bytes, cap, pc.oversized_request_policy)
            spool.recover()  # a fresh directory: creates it
            target = self._targets[key] = _Target(record, spool)
        return target

    def _spool(self, target: _Target, requests: list[tuple[str, int, int, bytes]]) -> None:
        if requests:
            for chunk in target.spool.add_many(requests):
                self._submit(target, chunk)

    def _submit(self, target: _Target, chunk: SpooledChunk) -> None:
        adapter, pc = self.pool.adapter_for(target.record)
        chunk_id = f"retry-{self.run_id}-chunk-{next(self._chunks):06d}"
        requests = [orjson.loads(line) for line in read_lines(chunk)]
        origins = sorted({target.origins.pop(cid, "") for cid, _, _ in chunk.read_ids()} - {""})
        modality = target.record.modality
        processor = self.pool.processor_for(target.record)
        base = self.run_dir.receipt_base(processor.name or processor.type)
        receipts = receipt_path(base, modality or "text", self.run_id)

        def create_and_record() -> str:
            try:
                raw = self.creator.create(adapter, pc, chunk, chunk_id, requests, retry_of=origins)
                adapter.parse_submission_result(raw)
            except Exception as exc:
                raise CollectorError(
                    f"resubmitting {len(requests)} request(s) to {pc.provider} failed "
                    f"({one_sentence(exc, adapter)}); the batches already resubmitted have "
                    "receipts, run 'mmirage retry' again for the rest"
                ) from None
            receipt = retry_receipt(
                adapter,
                pc,
                chunk,
                raw,
                chunk_id=chunk_id,
                modality=modality,
                processor=target.record.processor or "batch_api",
                run_id=self.run_id,
                run_dir=self.run_dir,
                retry_of=origins,
            )
            record_receipt(chunk, receipt, receipts)
            return str(receipt["provider_batch_id"])

        # In a thread a stop does not cut short: the batch it creates gets its receipt.
        self.report.new_batches.append(run_through_stop(create_and_record))


def _lines(chunk: SpooledChunk, wanted: set[str]) -> Iterable[tuple[str, int, int, bytes]]:
    """The wanted request lines of a spooled chunk, streamed (lines and ids in lockstep)."""
    with open(chunk.path, "rb") as lines:
        for (cid, source_index, dataset), line in zip(chunk.read_ids(), lines, strict=False):
            if cid in wanted:
                yield cid, source_index, dataset, line if line.endswith(b"\n") else line + b"\n"


__all__ = ["RetryReport", "retry_failed"]


@contextlib.contextmanager
def _retry_lock(run_dir: RunDir) -> Iterator[None]:
    """One retry per pipeline at a time: two would both resubmit (and pay for) the same
    failures."""
    import fcntl

    path = run_dir.retry_lock
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CollectorError(
                "another 'mmirage retry' of this pipeline is running; wait for it to finish"
            ) from None
        yield
