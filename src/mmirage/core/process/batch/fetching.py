"""Downloading terminal batches into the results store, each download checked before it is
stored.

A provider batch is downloaded once: the store marks it fetched and later merges read the
store. So a download must be whole before it is stored: a result file served empty, cut off
or with bytes that do not decode holds fewer results than the provider says the batch has
(``request_counts["answered"]``: its succeeded plus failed requests). Such a download is
tried again (``RETRY_DELAYS``); one still short is not stored at all and the batch stays
unfetched, so the next merge or retry downloads it again, and ``retry`` never resubmits
(and pays again for) requests the provider did answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm_kit.gcquiet import quiet_gc
from llm_kit.redact import redact_text
from mmirage.core.process.batch.adapter import FAILED, BatchSubmissionResult
from mmirage.core.process.batch.collector import AdapterPool, BatchStatus, one_sentence, poll
from mmirage.core.process.batch.errors import IncompleteResultsError
from mmirage.core.process.batch.results_store import (
    CANCELED,
    EXPIRED,
    MISSING,
    BatchRecord,
    ResultsStore,
)

if TYPE_CHECKING:
    from mmirage.config.batch_provider import BatchProviderConfig
    from mmirage.core.process.batch.adapter import BatchSubmissionAdapter

# Seconds between the downloads of one batch whose file came back short (bounded: a file
# damaged at the provider is reported, and the next merge tries again).
RETRY_DELAYS: Sequence[float] = (1.0, 2.0, 4.0)


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


def expected_results(result: BatchSubmissionResult) -> int | None:
    """How many results the provider says the batch has (``None``: an adapter that does not
    report it, whose downloads cannot be checked)."""
    answered = (result.request_counts or {}).get("answered")
    return answered if isinstance(answered, int) and answered > 0 else None


def download_whole(
    adapter: BatchSubmissionAdapter,
    record: BatchRecord,
    provider_config: BatchProviderConfig,
    expected: int | None,
    sleep: Callable[[float], None] = time.sleep,
) -> Sequence[Mapping[str, Any]]:
    """The batch's result rows, downloaded again (after each of ``RETRY_DELAYS``) while they
    are fewer than ``expected``; ``IncompleteResultsError`` when the last try is still short."""
    delays = list(RETRY_DELAYS)
    while True:
        rows = _errors_redacted(adapter, adapter.retrieve_results(record.batch_id, provider_config))
        got = len({row.get("custom_id") for row in rows if row.get("custom_id")})
        if expected is None or got >= expected:
            return rows
        if not delays:
            raise IncompleteResultsError(
                f"batch {record.batch_id} ({record.provider}): its result download held "
                f"{got} of the {expected} results the provider reports, "
                f"{len(RETRY_DELAYS) + 1} times; nothing of it was stored, rerun merge to "
                "download it again",
                got=got,
                expected=expected,
            )
        sleep(delays.pop(0))


def _errors_redacted(
    adapter: BatchSubmissionAdapter, rows: Sequence[Mapping[str, Any]]
) -> Sequence[Mapping[str, Any]]:
    """``rows`` with each error message redacted: a custom adapter may quote the provider's
    answer, key and all (the built-in ones pass llm_kit's redactor already)."""
    words = adapter.credentials.values()
    return [
        {**row, "error_message": redact_text(str(row["error_message"]), words)}
        if row.get("error_message")
        else row
        for row in rows
    ]


def fetch_terminal(
    store: ResultsStore,
    pool: AdapterPool,
    records: Iterable[BatchRecord],
    statuses: Mapping[tuple[str, str], BatchStatus] | None = None,
) -> FetchReport:
    """Download each terminal batch not fetched yet into the store (``statuses`` from a wait
    saves a second lookup); running batches are listed, never waited for."""
    report = FetchReport()
    # Rarer collections, start-up objects frozen out of them: a download makes a batch's
    # rows at once, and young sweeps over them found nothing to free.
    with quiet_gc():
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
        # A batch that failed as a whole may report failed requests yet have no file.
        expected = None if kind == "failed" else expected_results(result)
        rows = download_whole(adapter, record, provider_config, expected)
        store.store_results(*record.key, rows, unanswered=(kind, message))
    except _not_ready_errors():
        report.running.append(record)
        return
    except IncompleteResultsError as exc:
        report.errors.append(str(exc))
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
    "RETRY_DELAYS",
    "FetchReport",
    "download_whole",
    "expected_results",
    "fetch_terminal",
    "unanswered_reason",
]
