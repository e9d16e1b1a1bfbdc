"""Downloading terminal batches into the results store, once each."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmirage.core.process.batch.adapter import FAILED, BatchSubmissionResult
from mmirage.core.process.batch.collector import AdapterPool, BatchStatus, one_sentence, poll
from mmirage.core.process.batch.results_store import (
    CANCELED,
    EXPIRED,
    MISSING,
    BatchRecord,
    ResultsStore,
)

if TYPE_CHECKING:
    pass


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


__all__ = [
    "FetchReport",
    "fetch_terminal",
    "unanswered_reason",
]
