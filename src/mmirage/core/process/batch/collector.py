"""Bringing batch results home: receipts → provider status → results store → merged dataset.

``check``, ``merge`` and ``retry`` share these steps:

1. ``receipt_files`` finds the receipts (``--metadata-path`` or the config's globs; dry-run
   receipts are skipped by ``receipts.read_receipts``) and ``scan_receipts`` reads them once,
   line by line, into ``BatchRecord``s (and, for merge/retry, into the results store);
2. ``AdapterPool`` gives each batch the adapter of the processor that submitted it (by the
   receipt's ``processor``, else its ``provider``); a provider absent from the YAML is an error;
3. ``poll`` / ``wait_until_terminal`` ask the provider for each batch's status;
4. ``fetch_terminal`` downloads every terminal batch not fetched yet into the store (partial
   results of expired or canceled batches included) — once: a terminal batch never changes;
5. ``merged_rows`` streams the published shards in order (dataset 0 shards 0..n-1, dataset 1,
   ...) and rebuilds each row from its ``__vars__``: placeholders replaced by the results (JSON
   outputs parsed and validated), ``output_schema`` rendered again, so a merged row is what a
   live ``llm`` run would have written. A row whose result is unusable is kept, with the
   reason in ``__errors__`` and null schema values. Memory is O(1) in rows: one group of rows
   and its results at a time, the rest is in the store.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_kit.errors import ResponseValidationError
from llm_kit.schema import parse_response
from mmirage.core.process.batch.adapter import (
    FAILED,
    BatchSubmissionAdapter,
    BatchSubmissionResult,
    MissingCredentialsError,
)
from mmirage.core.process.batch.receipts import (
    batch_processors,
    config_receipt_globs,
    read_receipts,
    resolve_receipt_paths,
)
from mmirage.core.process.batch.results_store import (
    CANCELED,
    EXPIRED,
    MISSING,
    SUCCEEDED,
    BatchRecord,
    Outcome,
    ResultsStore,
)
from mmirage.core.process.variables import RowError
from mmirage.core.writer.renderer import (
    PLACEHOLDER_PREFIX,
    find_placeholders,
    is_placeholder,
    render_failed_columns,
    render_value,
)

if TYPE_CHECKING:
    from mmirage.config.batch_provider import BatchProviderConfig
    from mmirage.config.models import MMirageConfig
    from mmirage.config.processors import BatchApiProcessorConfig
    from mmirage.core.process.batch.receipts import Receipt

ROW_KEY, ERRORS, USAGE, VARS = "__row_key__", "__errors__", "__usage__", "__vars__"
INVALID = "invalid"  # a result that came back but is not valid JSON for its schema
LOOKUP_FAILED = "lookup_failed"
_PREFIX_LEN = len(PLACEHOLDER_PREFIX)


class CollectorError(Exception):
    """Check, merge or retry cannot go on; ``str(err)`` is one sentence saying what to do.
    ``exit_code`` 2 marks a problem of the setup (a missing key), 1 anything else."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# -- where things are -----------------------------------------------------------------------


def pipeline_state_dir(config: MMirageConfig) -> Path:
    """The pipeline's state folder, where the processor put spools and default receipts."""
    from mmirage.core.shard.state import status_path

    return status_path(config, 0).parent.parent


def store_path(config: MMirageConfig) -> Path:
    return pipeline_state_dir(config) / "batch" / "results.sqlite"


def open_store(config: MMirageConfig) -> ResultsStore:
    return ResultsStore(store_path(config))


def receipt_files(
    config: MMirageConfig, metadata_paths: Sequence[str] = (), config_path: str | None = None
) -> list[str]:
    """The receipt files to read, or a ``CollectorError`` naming what was tried."""
    globs = config_receipt_globs(config, str(pipeline_state_dir(config)))
    try:
        paths = resolve_receipt_paths(globs, metadata_paths)
    except FileNotFoundError as exc:
        raise CollectorError(f"{exc}; check the --metadata-path value") from None
    if not paths:
        tried = ", ".join(globs) or "(the config declares no batch_api processor)"
        raise CollectorError(
            f"no batch receipts found (tried {tried}); submit the batches first with "
            f"'mmirage run {config_path or config.config_path or 'CONFIG'}', or name receipt "
            "files with --metadata-path"
        )
    return paths


# -- receipts -------------------------------------------------------------------------------


@dataclass
class ReceiptScan:
    """The batches named by the receipts (first receipt wins), in receipt order."""

    batches: dict[tuple[str, str], BatchRecord] = field(default_factory=dict)
    resubmitted: set[str] = field(default_factory=set)  # batch ids named by a ``retry_of``
    skipped: int = 0  # receipts of another pipeline or configuration

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


def require_batches(scan: ReceiptScan) -> None:
    """A ``CollectorError`` when every receipt found belongs to another pipeline or to an
    earlier configuration of this one (nothing of the current run to report)."""
    if not scan.batches and scan.skipped:
        raise CollectorError(
            f"the {scan.skipped} receipt(s) found belong to another pipeline sharing "
            "metadata_output_path, or to this pipeline before its configuration changed; "
            "run 'mmirage run' with this configuration first"
        )


def pipeline_key(config: MMirageConfig) -> tuple[str, str]:
    """``(pipeline_id, fingerprint)``: what a receipt must carry to belong to ``config``."""
    from mmirage.core.shard.state import fingerprint, pipeline_id

    return pipeline_id(config), fingerprint(config)


def scan_receipts(
    paths: Iterable[str],
    store: ResultsStore | None = None,
    *,
    only: tuple[str, str] | None = None,
) -> ReceiptScan:
    """Read the receipts once; with a store, record each new batch and its requests there
    (a receipt's id map is dropped as soon as it is stored: memory stays O(batches)).
    ``only``: skip receipts stamped with another ``(pipeline_id, fingerprint)`` — another
    pipeline sharing the metadata path, or this one before its configuration changed."""
    scan = ReceiptScan()
    for receipt in read_receipts(paths):
        stamp = (receipt.data.get("pipeline_id") or "", receipt.data.get("fingerprint") or "")
        if only is not None and stamp[0] and stamp != only:
            scan.skipped += 1
            continue
        record = _record(receipt)
        if record.key in scan.batches:
            continue
        retry_of = receipt.data.get("retry_of") or []
        scan.resubmitted.update(str(b) for b in retry_of)
        if store is not None:
            store.add_batch(record, receipt.custom_ids)
            record = store.batch(*record.key) or record
        scan.batches[record.key] = record
    return scan


# -- adapters -------------------------------------------------------------------------------


class AdapterPool:
    """One adapter per batch_api processor of the config, created on first use (so a missing
    key fails only when that provider is actually needed)."""

    def __init__(self, config: MMirageConfig) -> None:
        from mmirage.core.process.batch.registry import load_provider_plugins

        load_provider_plugins()
        self.config = config
        self._processors = {_key(p): p for p in batch_processors(config)}
        self._adapters: dict[str, BatchSubmissionAdapter] = {}

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
            from mmirage.core.process.batch.registry import BatchAdapterRegistry

            try:
                adapter = BatchAdapterRegistry.create(processor.provider_config)
            except MissingCredentialsError as exc:
                raise CollectorError(str(exc), exit_code=2) from None
            except LookupError as exc:
                raise CollectorError(str(exc), exit_code=2) from None
            self._adapters[key] = adapter
        return adapter, processor.provider_config


def _key(processor: BatchApiProcessorConfig) -> str:
    return processor.name or processor.type


def one_sentence(exc: BaseException, adapter: BatchSubmissionAdapter | None = None) -> str:
    """An exception as one line, with any credential value blanked out."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    for secret in adapter.credentials.values() if adapter is not None else ():
        if secret:
            text = text.replace(secret, "***")
    return text


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


# -- fetching -------------------------------------------------------------------------------


@dataclass
class FetchReport:
    fetched: list[BatchRecord] = field(default_factory=list)  # downloaded by this call
    running: list[BatchRecord] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one sentence per batch that failed


def _not_ready_errors() -> tuple[type[BaseException], ...]:
    """The built-in adapters' "batch not finished" error (absent in a custom adapter)."""
    try:
        from mmirage.core.process.batch.adapters import BatchNotReadyError
    except ImportError:
        return ()
    return (BatchNotReadyError,)


def unanswered_reason(record: BatchRecord, result: BatchSubmissionResult) -> tuple[str, str]:
    """(kind, message) for the requests a terminal batch returned no result for."""
    word = (result.provider_status or result.status or "").lower()
    if "expire" in word:  # provider words vary: expired, JOB_STATE_EXPIRED, ...
        return EXPIRED, f"batch {record.batch_id} expired before this request ran"
    if "cancel" in word:
        return CANCELED, f"batch {record.batch_id} was canceled before this request ran"
    if result.status == FAILED:
        return "failed", f"batch {record.batch_id} failed at the provider ({word or 'failed'})"
    return MISSING, f"batch {record.batch_id} returned no result for it"


def fetch_terminal(
    store: ResultsStore,
    pool: AdapterPool,
    records: Iterable[BatchRecord],
    statuses: Mapping[tuple[str, str], BatchStatus] | None = None,
) -> FetchReport:
    """Download each terminal batch not fetched yet into the store (``statuses`` from a wait
    saves a second lookup); running batches are listed, never waited for."""
    report = FetchReport()
    for record in records:
        current = store.batch(*record.key) or record
        if current.fetched:
            continue
        status = (statuses or {}).get(record.key) or poll(pool, record)
        if status.result is None:
            report.errors.append(f"batch {record.batch_id} ({record.provider}): {status.error}")
            continue
        store.set_status(*record.key, status.result.status, status.result.provider_status)
        if not status.result.is_terminal:
            report.running.append(current)
            continue
        _download(store, pool, current, status.result, report)
    return report


def _download(
    store: ResultsStore,
    pool: AdapterPool,
    record: BatchRecord,
    result: BatchSubmissionResult,
    report: FetchReport,
) -> None:
    adapter, provider_config = pool.adapter_for(record)
    kind, message = unanswered_reason(record, result)
    try:
        rows: Iterable[Mapping[str, Any]] = adapter.retrieve_results(
            record.batch_id, provider_config
        )
        store.store_results(*record.key, rows, unanswered=(kind, message))
    except _not_ready_errors():
        report.running.append(record)
        return
    except Exception as exc:
        if kind != "failed":
            report.errors.append(
                f"batch {record.batch_id} ({record.provider}): downloading its results failed "
                f"({one_sentence(exc, adapter)}); rerun to try again"
            )
            return
        # A batch that failed as a whole may have nothing to download: its requests failed.
        store.store_results(*record.key, (), unanswered=(kind, message))
    report.fetched.append(record)


# -- merging ----------------------------------------------------------------------------------


@dataclass
class MergeTotals:
    """What a merge wrote: rows, per-request outcomes, tokens (per model, for the cost)."""

    rows: int = 0
    rows_with_errors: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    usage_reported: bool = False
    tokens_by_model: dict[str, list[int]] = field(default_factory=dict)

    def add_usage(self, model: str | None, outcome: Outcome) -> bool:
        if outcome.input_tokens is None and outcome.output_tokens is None:
            return False
        tin, tout = outcome.input_tokens or 0, outcome.output_tokens or 0
        self.usage_reported = True
        self.input_tokens += tin
        self.output_tokens += tout
        per_model = self.tokens_by_model.setdefault(model or "", [0, 0])
        per_model[0] += tin
        per_model[1] += tout
        return True


class RowBuilder:
    """Rebuilds one published row, in place, from its ``__vars__`` and its requests' outcomes.

    Only the schema columns that still hold a placeholder are rendered again: the others read
    no pending variable, so the run already rendered them from the same values (rendering is a
    pure function). That keeps a merged row equal to a live run's at a fraction of the cost.
    """

    def __init__(self, config: MMirageConfig) -> None:
        pp = config.processing_params
        self.schema = pp.output_schema
        self._json_models: dict[str, Any] = {}
        self._models: dict[str, str | None] = {}  # output name → provider model (cost)
        for output in pp.outputs:
            if output.type != "batch_api":
                continue
            if getattr(output, "is_json", False):
                name = "".join(part.capitalize() for part in output.name.split("_"))
                self._json_models[output.name] = output.schema.pydantic_model(name or "Output")
            provider_config = getattr(config.processor_for(output), "provider_config", None)
            self._models[output.name] = getattr(provider_config, "model", None)

    @staticmethod
    def pending(row: Mapping[str, Any]) -> list[tuple[str, str]]:
        """``(variable, custom_id)`` of each placeholder in the row's ``__vars__``."""
        variables = row.get(VARS)
        if type(variables) is not dict:
            return []
        return [
            (name, value[_PREFIX_LEN:])
            for name, value in variables.items()
            if type(value) is str and value.startswith(PLACEHOLDER_PREFIX)
        ]

    def rebuild(
        self,
        row: dict[str, Any],
        pending: Sequence[tuple[str, str]],
        outcomes: Mapping[str, Outcome],
        totals: MergeTotals,
    ) -> dict[str, Any]:
        """``row`` rebuilt in place; ``pending`` is ``self.pending(row)``."""
        totals.rows += 1
        variables = row.pop(VARS, None)
        earlier = _errors(row)
        if type(variables) is not dict:  # complete at run time, or failed then
            row[ERRORS] = earlier or None
            totals.rows_with_errors += bool(earlier)
            return row
        errors = dict(earlier)
        filled = dict(variables)
        tokens: list[int] | None = None
        for name, cid in pending:
            outcome = outcomes[cid]
            if totals.add_usage(self._models.get(name), outcome):
                tokens = tokens or [0, 0]
                tokens[0] += outcome.input_tokens or 0
                tokens[1] += outcome.output_tokens or 0
            state, usable = self._value(name, outcome)
            totals.requests[state] += 1
            if state == SUCCEEDED:
                filled[name] = usable
            else:
                errors[name] = usable
        unavailable = [n for n in errors if n not in filled or is_placeholder(filled[n])]
        if not unavailable:  # nothing failed without a fallback
            self._render(row, filled, errors)
        elif (problem := render_failed_columns(self.schema, row, filled, unavailable)) is not None:
            errors.setdefault("__schema__", problem)
        row[ERRORS] = errors or None
        self._add_usage(row, tokens)
        totals.rows_with_errors += bool(errors)
        return row

    def _value(self, name: str, outcome: Outcome) -> tuple[str, Any]:
        """(state, value) for a usable result, else (state, the reason for ``__errors__``)."""
        if not outcome.ok:
            return outcome.state, outcome.reason()
        model = self._json_models.get(name)
        text = outcome.text or ""
        if model is None:
            return SUCCEEDED, text.strip()  # plain outputs: stripped, like a live run
        try:
            return SUCCEEDED, parse_response(text, model).model_dump(by_alias=True)
        except ResponseValidationError as exc:
            return INVALID, str(exc)

    def _render(
        self, row: dict[str, Any], variables: Mapping[str, Any], errors: dict[str, str]
    ) -> None:
        """Render again the schema columns that hold a placeholder; a template that fails on
        the real values is a ``__schema__`` error, as in a live run."""
        try:
            updates = {
                key: render_value(tree, variables, f"output_schema.{key}")
                for key, tree in self.schema.items()
                if _has_placeholder(row.get(key))
            }
        except RowError as exc:
            errors["__schema__"] = str(exc)
            row.update(dict.fromkeys(self.schema))
        else:
            row.update(updates)

    @staticmethod
    def _add_usage(row: dict[str, Any], tokens: list[int] | None) -> None:
        """``__usage__`` gains the batch tokens; ``input_tokens``/``output_tokens`` appear only
        when the provider reported usage."""
        usage = row.get(USAGE)
        usage = usage if isinstance(usage, Mapping) else {}
        extra = tokens or [0, 0]
        row[USAGE] = {
            "input_tokens": int(usage.get("input_tokens") or 0) + extra[0],
            "output_tokens": int(usage.get("output_tokens") or 0) + extra[1],
        }
        if tokens is not None:
            row["input_tokens"], row["output_tokens"] = tokens


def _errors(row: Mapping[str, Any]) -> dict[str, str]:
    """The row's ``__errors__`` as a dict (Arrow formats fill absent keys with null)."""
    errors = row.get(ERRORS)
    if not errors or not isinstance(errors, dict):
        return {}
    return {str(k): str(v) for k, v in errors.items() if v is not None}


def _has_placeholder(value: Any) -> bool:
    """Does a rendered schema value still wait for a batch result? (the hot path: no ABCs)"""
    if type(value) is str:
        return value.startswith(PLACEHOLDER_PREFIX)
    return isinstance(value, dict | list) and bool(find_placeholders(value))


def published_shards(config: MMirageConfig) -> list[Any]:
    """Every dataset's published shards in order, or a ``CollectorError`` naming the first
    shard that is not published yet."""
    from mmirage.core.writer.merge import config_shards

    lp = config.loading_params
    ordered: list[Any] = []
    for ds in lp.datasets:
        shards, missing = config_shards(ds.output_dir, lp.num_shards, lp.output_format)
        if missing:
            raise CollectorError(
                f"{ds.output_dir}: shard(s) {', '.join(map(str, missing))} of "
                f"{lp.num_shards} are not published yet; finish them with 'mmirage run CONFIG' "
                "and merge again"
            )
        ordered.extend(shards)
    return ordered


def merged_rows(
    config: MMirageConfig, store: ResultsStore, totals: MergeTotals, shards: Sequence[Any]
) -> Iterator[list[dict[str, Any]]]:
    """The rebuilt rows, one group of published rows (and one store lookup) at a time."""
    builder = RowBuilder(config)
    for shard in shards:
        for batch in shard.batches():
            pending = [builder.pending(row) for row in batch]
            ids = [cid for found in pending for _, cid in found]
            outcomes = store.lookup(ids) if ids else {}
            yield [
                builder.rebuild(r, p, outcomes, totals) for r, p in zip(batch, pending, strict=True)
            ]


def write_merged(
    config: MMirageConfig, store: ResultsStore, output_path: str | Path
) -> MergeTotals:
    """Write the merged dataset to ``output_path`` as one ordered JSONL file, atomically."""
    from mmirage.core.writer.formats import FormatError, write_dataset

    shards = published_shards(config)
    dest = Path(output_path).expanduser()
    if any(dest.resolve() == Path(s.path).resolve() for s in shards):
        raise CollectorError(
            f"--output-path {dest} is one of the published shards it reads; choose another file"
        )
    totals = MergeTotals()
    try:
        write_dataset(lambda: merged_rows(config, store, totals, shards), dest, "jsonl")
    except FormatError as exc:
        raise CollectorError(
            f"{exc}; the shard may be damaged, rerun it with --recompute"
        ) from None
    return totals


__all__ = [
    "INVALID",
    "LOOKUP_FAILED",
    "AdapterPool",
    "BatchStatus",
    "CollectorError",
    "FetchReport",
    "MergeTotals",
    "ReceiptScan",
    "RowBuilder",
    "fetch_terminal",
    "merged_rows",
    "one_sentence",
    "open_store",
    "pipeline_state_dir",
    "poll",
    "published_shards",
    "receipt_files",
    "scan_receipts",
    "store_path",
    "unanswered_reason",
    "wait_until_terminal",
    "write_merged",
]
