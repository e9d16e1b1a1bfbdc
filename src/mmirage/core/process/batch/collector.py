"""Bringing batch results home: receipts → provider status → results store → merged dataset.

``check``, ``merge`` and ``retry`` share these steps:

1. ``receipt_files`` finds the receipts (``--metadata-path`` or the config's globs; dry-run
   receipts are skipped by ``receipts.read_receipts``) and ``scan_receipts`` reads them once,
   line by line, into ``BatchRecord``s (and, for merge/retry, into the results store);
2. ``AdapterPool`` gives each batch the adapter of the processor that submitted it (by the
   receipt's ``processor``, else its ``provider``); a provider absent from the YAML is an error;
3. ``poll`` / ``wait_until_terminal`` ask the provider for each batch's status;
4. ``fetching.fetch_terminal`` downloads every terminal batch not fetched yet into the store
   (partial results of expired or canceled batches included), checked against the batch's own
   counts — once: a terminal batch never changes;
5. ``mmirage.core.merge.merged_output.merged_rows`` (not this package: merging reads the
   published shards) streams the published shards in order (dataset 0 shards
   0..n-1, dataset 1, ...) and ``row_rebuild.RowBuilder`` rebuilds each row from its
   ``__vars__``: its own placeholders replaced by the results (JSON outputs parsed and
   validated), ``output_schema`` rendered again, so a merged row is what a live ``llm`` run
   would have written. A row whose result is unusable is kept, with the reason in
   ``__errors__`` and null schema values.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llm_kit.redact import redact_text
from mmirage.core.process.batch.adapter import (
    BatchSubmissionAdapter,
    BatchSubmissionResult,
    MissingCredentialsError,
)
from mmirage.core.process.batch.errors import CollectorError, CollectorSetupError
from mmirage.core.process.batch.receipt_recovery import with_spooled_receipts
from mmirage.core.process.batch.receipts import (
    batch_processors,
    endpoint,
    read_receipts,
    receipt_globs,
    resolve_receipt_paths,
)
from mmirage.core.process.batch.registry import BatchAdapterRegistry, load_provider_plugins
from mmirage.core.process.batch.results_store import BatchRecord, ResultsStore
from mmirage.core.process.batch.store_lock import exclusive
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.batch_provider import BatchProviderConfig
    from mmirage.config.models import MMirageConfig
    from mmirage.config.processors import BatchApiProcessorConfig
    from mmirage.core.process.batch.receipts import Receipt

LOOKUP_FAILED = "lookup_failed"


# -- where things are -----------------------------------------------------------------------


@contextlib.contextmanager
def open_store(run_dir: RunDir) -> Iterator[ResultsStore]:
    """The pipeline's results store, held by this process alone until closed."""
    path = run_dir.results_store
    with exclusive(path), ResultsStore(path) as store:
        yield store


def receipt_files(
    run_dir: RunDir, metadata_paths: Sequence[str] = (), config_path: str = "CONFIG"
) -> list[str]:
    """The receipt files to read, or a ``CollectorError`` naming what was tried."""
    globs = receipt_globs(run_dir)
    try:
        paths = resolve_receipt_paths(globs, metadata_paths)
    except FileNotFoundError as exc:
        raise CollectorSetupError(f"{exc}; check the --metadata-path value") from None
    if not metadata_paths:
        paths = with_spooled_receipts(paths, run_dir.batch_dir())
    if not paths:
        tried = ", ".join(globs) or "(the config declares no batch_api processor)"
        raise CollectorSetupError(
            f"no batch receipts found (tried {tried}); submit the batches first with "
            f"'mmirage run {config_path}', or name receipt files with --metadata-path"
        )
    return paths


# -- receipts -------------------------------------------------------------------------------


@dataclass
class ReceiptScan:
    """The batches named by the receipts (first receipt wins), in receipt order."""

    batches: dict[tuple[str, str], BatchRecord] = field(default_factory=dict)
    resubmitted: set[str] = field(default_factory=set)  # batch ids named by a ``retry_of``
    # Batch ids of receipts skipped: stamped by another pipeline, or by this one under an
    # earlier configuration that sent its requests elsewhere (another provider or base_url).
    other_pipelines: set[str] = field(default_factory=set)
    earlier_config: set[str] = field(default_factory=set)

    @property
    def records(self) -> list[BatchRecord]:
        return list(self.batches.values())


def _record(receipt: Receipt) -> BatchRecord:
    data = receipt.data
    snapshot = data.get("model_params_snapshot") or {}
    return BatchRecord(
        provider=receipt.provider,
        batch_id=receipt.batch_id,
        processor=data.get("processor"),
        modality=snapshot.get("modality") if isinstance(snapshot, dict) else None,
        spool_path=data.get("spool_path"),
        submitted_at=receipt.submitted_at,
        request_count=int(data.get("submitted_request_count") or len(receipt.custom_ids)),
    )


def require_batches(scan: ReceiptScan, paths: Sequence[str] = ()) -> None:
    """A ``CollectorError`` when the receipts read name no batch of the current run: every
    receipt belongs to another pipeline or to an earlier configuration of this one that sent
    its requests elsewhere, or the files hold no receipt at all (not receipt files, or only
    dry-run receipts)."""
    if scan.batches:
        return
    if scan.earlier_config:
        raise CollectorError(
            f"the {len(scan.earlier_config)} batch(es) the receipts name were submitted by "
            "this pipeline under an earlier configuration, to another provider or base_url: "
            "run 'mmirage run CONFIG' first (it submits what this configuration asks), or "
            "merge with the configuration that submitted them"
        )
    if scan.other_pipelines:
        raise CollectorError(
            f"the {len(scan.other_pipelines)} batch(es) the receipts name belong to another "
            "pipeline sharing metadata_output_path (its datasets' output_dir or num_shards "
            "differ from this configuration's): merge with the configuration that submitted "
            "them"
        )
    named = ", ".join(paths) or "the receipt files"
    raise CollectorError(
        f"no batch receipt found in {named} (dry-run receipts are skipped); name the "
        "<metadata_output_path>.<modality>.<run_id>.jsonl files that 'mmirage run' wrote"
    )


@dataclass(frozen=True)
class PipelineKey:
    """What a receipt must carry to belong to a configuration: its pipeline id; and, for a
    receipt of an earlier configuration, one of the endpoints this one sends to."""

    pipeline_id: str
    fingerprint: str
    endpoints: frozenset[str]


def scan_receipts(
    paths: Iterable[str],
    store: ResultsStore | None = None,
    *,
    only: PipelineKey | None = None,
) -> ReceiptScan:
    """Read the receipts once; with a store, record each new batch and its requests there
    (a receipt's id map is dropped as soon as it is stored: memory stays O(batches)).
    ``only``: skip receipts of another pipeline sharing the metadata path, and those of an
    earlier configuration that sent to another endpoint (every request of theirs was
    submitted again since). Those of an earlier configuration that sent here are read: a
    recomputed shard stands on their batches for the requests that did not change, and the
    store answers each request from its latest submission only."""
    scan = ReceiptScan()
    for receipt in read_receipts(paths):
        data = receipt.data
        stamp = (data.get("pipeline_id") or "", data.get("fingerprint") or "")
        if only is not None and stamp[0] and stamp[1] != only.fingerprint:
            if stamp[0] != only.pipeline_id:
                scan.other_pipelines.add(receipt.batch_id)
                continue
            if data.get("endpoint") not in only.endpoints:
                scan.earlier_config.add(receipt.batch_id)
                continue
        record = _record(receipt)
        if record.key in scan.batches:
            continue
        retry_of = receipt.data.get("retry_of") or []
        scan.resubmitted.update(str(b) for b in retry_of)
        if store is not None:
            store.add_batch(record, receipt.custom_ids, resubmission=bool(retry_of))
            record = store.batch(*record.key) or record
        scan.batches[record.key] = record
    return scan


# -- adapters -------------------------------------------------------------------------------


class AdapterPool:
    """One adapter per batch_api processor of the config, created on first use (so a missing
    key fails only when that provider is actually needed)."""

    def __init__(self, config: MMirageConfig) -> None:
        load_provider_plugins()
        self.config = config
        self._processors = {_key(p): p for p in batch_processors(config)}
        self._adapters: dict[str, BatchSubmissionAdapter] = {}

    def pipeline_key(self, run_dir: RunDir) -> PipelineKey:
        """Which receipts are this pipeline's: its run identity and the endpoints it sends to."""
        endpoints = frozenset(endpoint(p.provider_config) for p in self._processors.values())
        return PipelineKey(run_dir.pipeline_id, run_dir.fingerprint, endpoints)

    def processor_for(self, record: BatchRecord) -> BatchApiProcessorConfig:
        named = self._processors.get(record.processor or "")
        if named is not None and named.provider_config.provider == record.provider:
            return named
        for processor in self._processors.values():
            if processor.provider_config.provider == record.provider:
                return processor
        where = f" ({self.config.config_path})" if self.config.config_path else ""
        raise CollectorError(
            f"the receipts name provider '{record.provider}' (batch {record.batch_id}) but the "
            f"config{where} declares no batch_api processor with provider: {record.provider}; "
            "add it, or pass --metadata-path with only the receipts of this config"
        )

    def check_providers(self, records: Iterable[BatchRecord]) -> None:
        """Fail before any network call when a receipt's provider is not in the config."""
        for record in records:
            self.processor_for(record)

    def adapter_for(
        self, record: BatchRecord
    ) -> tuple[BatchSubmissionAdapter, BatchProviderConfig]:
        processor = self.processor_for(record)
        key = _key(processor)
        adapter = self._adapters.get(key)
        if adapter is None:
            try:
                adapter = BatchAdapterRegistry.create(processor.provider_config)
            except MissingCredentialsError as exc:
                raise CollectorSetupError(str(exc)) from None
            except LookupError as exc:
                raise CollectorSetupError(str(exc)) from None
            self._adapters[key] = adapter
        return adapter, processor.provider_config


def _key(processor: BatchApiProcessorConfig) -> str:
    return processor.name or processor.type


def one_sentence(exc: BaseException, adapter: BatchSubmissionAdapter | None = None) -> str:
    """An exception as one line, with any credential value blanked out."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return redact_text(text, adapter.credentials.values() if adapter is not None else ())


# -- status -------------------------------------------------------------------------------


@dataclass
class BatchStatus:
    """One status lookup: the adapter's answer, or why the lookup failed."""

    record: BatchRecord
    result: BatchSubmissionResult | None = None
    error: str | None = None

    @property
    def status(self) -> str:
        return LOOKUP_FAILED if self.result is None else self.result.status

    @property
    def terminal(self) -> bool:
        """Nothing more will change (a failed lookup is not retried by --wait)."""
        return self.result is None or self.result.is_terminal


def poll(pool: AdapterPool, record: BatchRecord) -> BatchStatus:
    adapter, provider_config = pool.adapter_for(record)
    try:
        return BatchStatus(record, adapter.check_batch_status(record.batch_id, provider_config))
    except Exception as exc:
        return BatchStatus(record, error=one_sentence(exc, adapter))


ProgressCallback = Callable[[Sequence[BatchStatus]], None]


def wait_until_terminal(
    pool: AdapterPool,
    records: Sequence[BatchRecord],
    interval: float,
    on_poll: ProgressCallback | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[tuple[str, str], BatchStatus]:
    """Poll every ``interval`` seconds until every batch is terminal; each round's statuses
    go to ``on_poll`` (the CLI's progress display)."""
    statuses: dict[tuple[str, str], BatchStatus] = {}
    pending = list(records)
    while True:
        for record in pending:
            statuses[record.key] = poll(pool, record)
        if on_poll is not None:
            on_poll([statuses[r.key] for r in records])
        pending = [r for r in pending if not statuses[r.key].terminal]
        if not pending:
            return statuses
        sleep(interval)


__all__ = [
    "LOOKUP_FAILED",
    "AdapterPool",
    "BatchStatus",
    "CollectorError",
    "PipelineKey",
    "ReceiptScan",
    "one_sentence",
    "open_store",
    "poll",
    "receipt_files",
    "require_batches",
    "scan_receipts",
    "wait_until_terminal",
]


if __name__ == "__main__":
    # The original ran its collector as a module; here it is a library, and a silent exit 0
    # would read as "merged".
    raise SystemExit(
        "error: this module is not a command; merge batch results with: mmirage merge "
        "--config CONFIG --output-path OUTPUT [--metadata-path RECEIPT ...]"
    )
