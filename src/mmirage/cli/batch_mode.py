"""``mmirage check``, ``merge`` and ``retry`` for a config with a ``batch_api`` processor.

Plain functions that print with ``click.echo`` and return the exit code; the commands reach
them through ``mmirage.cli.results`` when the config declares a batch_api processor.

Exit codes: ``check`` 1 only when a batch failed at the provider (and was not resubmitted by
``retry`` since), a status lookup failed or a published shard is damaged (as a live check
finds it: its size or rows differ from those recorded at publish), 0 otherwise — also while
batches are running;
``merge`` 0 when the file is written with a value for every request that has ended (even
partial: it says how many batches are still running), 1 when a published shard is damaged
(size, rows or checksum: nothing is written), a request failed, expired, was
canceled, is missing or came back as invalid JSON (it says that ``mmirage retry`` resubmits
them), or when a batch could not be looked up or downloaded; ``retry`` 0 when everything
that could be resubmitted was. Any of them: 1 when no receipt is found (a file given with
--metadata-path that holds no receipt, or only dry-run ones) or a receipt's provider is not
in the config, 2 when a provider's API key is missing. Errors are one sentence, never a
traceback, and never contain a key.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mmirage.cli.errors import code_of
from mmirage.core.merge.merged_output import write_merged
from mmirage.core.merge.row_rebuild import INVALID
from mmirage.core.process.batch.adapter import COMPLETED, FAILED, IN_PROGRESS, UNKNOWN
from mmirage.core.process.batch.collector import (
    LOOKUP_FAILED,
    AdapterPool,
    BatchStatus,
    open_store,
    poll,
    receipt_files,
    require_batches,
    scan_receipts,
    wait_until_terminal,
)
from mmirage.core.process.batch.cost import (
    PRICES_AS_OF,
    PRICES_ENV,
    format_usd,
)
from mmirage.core.process.batch.fetching import FetchReport, fetch_terminal
from mmirage.core.process.batch.resubmit import retry_failed
from mmirage.core.process.batch.results_store import (
    CANCELED,
    EXPIRED,
    MISSING,
    RUNNING,
    SUCCEEDED,
)
from mmirage.core.process.batch.results_store import FAILED as REQUEST_FAILED
from mmirage.core.shard.published import shard_damage
from mmirage.errors import WorkFailed
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.core.merge.row_rebuild import MergeTotals
    from mmirage.core.process.batch.results_store import BatchRecord

_STATUS_ORDER = (COMPLETED, IN_PROGRESS, FAILED, UNKNOWN, LOOKUP_FAILED)
_COUNT_ORDER = ("succeeded", "errored", "expired", "canceled", "processing")


def _error(message: str) -> None:
    click.echo(f"error: {message}", err=True)


def _one_sentence(work: Callable[[], int]) -> int:
    """``work()``'s exit code; a known error, a file or a results store that cannot be used
    becomes ``error: <sentence>`` and its exit code."""

    def guarded() -> int:
        try:
            return work()
        except OSError as exc:
            where = f" ({exc.filename})" if exc.filename else ""
            raise WorkFailed(f"{exc.strerror or exc}{where}; check the path and the disk") from exc
        except sqlite3.Error as exc:
            raise WorkFailed(
                f"the batch results store cannot be used ({exc}); if another merge or retry is "
                "running, wait for it, else delete results.sqlite: it is rebuilt from the receipts"
            ) from exc

    return code_of(guarded)


# -- check ----------------------------------------------------------------------------------


def batch_check(
    config: MMirageConfig,
    config_path: str | Path | None = None,
    metadata_paths: Sequence[str] = (),
    wait: bool = False,
    poll_interval: float | None = None,
    *,
    run_dir: RunDir | None = None,
) -> int:
    """Report each provider batch's status, then the per-provider summary block."""
    run_dir = run_dir or RunDir.of(config)

    def work() -> int:
        paths = receipt_files(run_dir, metadata_paths, str(config_path or config.config_path))
        # Receipts named by hand are checked whatever made them; found ones must be ours.
        pool = AdapterPool(config)
        key = None if metadata_paths else pool.pipeline_key(run_dir)
        scan = scan_receipts(paths, only=key)
        require_batches(scan, paths)
        pool.check_providers(scan.records)
        interval = poll_interval or config.execution_params.poll_interval_seconds
        if wait:
            statuses = _wait(pool, scan.records, interval)
        else:
            statuses = {r.key: poll(pool, r) for r in scan.records}
        ordered = [statuses[r.key] for r in scan.records]
        for status in ordered:
            click.echo(_status_line(status, status.record.batch_id in scan.resubmitted))
        click.echo(_summary(ordered))
        blocking = [
            s
            for s in ordered
            if s.status == LOOKUP_FAILED
            or (s.status == FAILED and s.record.batch_id not in scan.resubmitted)
        ]
        damaged = _damaged_shards(config)
        for message in damaged:
            _error(message)
        return 1 if blocking or damaged else 0

    return _one_sentence(work)


def _damaged_shards(config: MMirageConfig) -> list[str]:
    """One sentence per published shard that is no longer what was published, checked as a
    live ``check`` does: a merge would lose its rows' placeholders, hence their results."""
    shard_ids = range(config.loading_params.num_shards)
    return [f"shard {k}: {damage}" for k in shard_ids if (damage := shard_damage(config, k))]


def _status_line(status: BatchStatus, resubmitted: bool) -> str:
    record = status.record
    line = f"Batch {record.batch_id} ({record.provider}): {status.status}"
    if status.result is None:
        return f"{line} ({status.error})"
    result = status.result
    details = []
    if result.provider_status and result.provider_status != result.status:
        details.append(f"provider status {result.provider_status}")
    counts = result.request_counts or {}
    total = counts.get("total") or record.request_count
    parts = [f"{counts[k]} {k}" for k in _COUNT_ORDER if counts.get(k)]
    noun = "request" if total == 1 else "requests"
    details.append(f"{total} {noun}" + (f": {', '.join(parts)}" if parts else ""))
    if resubmitted and result.status == FAILED:
        details.append("its requests were resubmitted by 'mmirage retry'")
    return f"{line} ({'; '.join(details)})"


def _summary(statuses: Sequence[BatchStatus]) -> str:
    """The original's block: per provider, each status as count/total."""
    by_provider: dict[str, Counter[str]] = {}
    for status in statuses:
        by_provider.setdefault(status.record.provider, Counter())[status.status] += 1
    lines = ["------------ Batch status summary ------------"]
    for provider, counts in by_provider.items():
        total = sum(counts.values())
        lines.append(f"Provider '{provider}' (Total: {total}):")
        ordered = [s for s in _STATUS_ORDER if s in counts]
        ordered += sorted(s for s in counts if s not in _STATUS_ORDER)
        lines += [f"  - {s}: {counts[s]}/{total}" for s in ordered]
    return "\n".join(lines)


def _wait(
    pool: AdapterPool, records: Sequence[BatchRecord], interval: float
) -> dict[tuple[str, str], BatchStatus]:
    """Poll until every batch is terminal, with a progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task("waiting for batches", total=len(records))

        def show(statuses: Sequence[BatchStatus]) -> None:
            done = sum(s.terminal for s in statuses)
            total = sum(
                (s.result.request_counts if s.result else {}).get("total", 0) for s in statuses
            )
            running = sum(
                (s.result.request_counts if s.result else {}).get("processing", 0)
                for s in statuses
                if not s.terminal
            )
            requests = f", requests {total - running}/{total} done" if total else ""
            progress.update(task, completed=done, description=f"batches finished{requests}")

        return wait_until_terminal(pool, records, interval, show)


# -- merge ----------------------------------------------------------------------------------


def batch_merge(
    config: MMirageConfig,
    output_path: str | Path,
    metadata_paths: Sequence[str] = (),
    wait: bool = False,
    *,
    run_dir: RunDir | None = None,
) -> int:
    """Fetch every finished batch, rebuild the dataset into ``output_path`` (one ordered JSONL
    file, written atomically) and print the run totals."""
    run_dir = run_dir or RunDir.of(config)

    def work() -> int:
        paths = receipt_files(run_dir, metadata_paths, str(config.config_path))
        pool = AdapterPool(config)
        with open_store(run_dir) as store:
            scan = scan_receipts(paths, store, only=pool.pipeline_key(run_dir))
            require_batches(scan, paths)
            pool.check_providers(scan.records)
            todo = [r for r in scan.records if not (store.batch(*r.key) or r).fetched]
        statuses = None
        if wait:  # with the store let go: another merge need not wait hours for this one
            statuses = _wait(pool, todo, config.execution_params.poll_interval_seconds)
        with open_store(run_dir) as store:  # opened again: what another merge did meanwhile
            fetch = fetch_terminal(store, pool, scan.records, statuses)
            totals = write_merged(config, run_dir, store, output_path)
        for message in fetch.errors:
            _error(message)
        click.echo(f"merged {totals.rows} rows into {Path(output_path).expanduser()}")
        for line in _totals_lines(totals):
            click.echo(line)
        _echo_running(fetch, len(scan.records))
        unusable = _unusable_results(totals, config.config_path)
        for message in unusable:
            _error(message)
        return 1 if fetch.errors or unusable else 0

    return _one_sentence(work)


def _unusable_results(totals: MergeTotals, config_path: str | None) -> list[str]:
    """One sentence per kind of request the merged file holds no value for (those still
    running are not counted: rerunning merge brings them in)."""
    requests = totals.requests
    messages = []
    kinds = (REQUEST_FAILED, EXPIRED, CANCELED, MISSING)
    redo = sum(requests[kind] for kind in kinds)
    if redo:
        parts = ", ".join(f"{requests[kind]} {kind}" for kind in kinds if requests[kind])
        messages.append(
            f"{redo} request(s) have no result in the merged file ({parts}); "
            f"'mmirage retry --config {config_path or 'CONFIG'}' resubmits them, then "
            "merge again"
        )
    if requests[INVALID]:
        messages.append(
            f"{requests[INVALID]} result(s) are not valid JSON for their output_schema (their "
            "rows hold the reason in __errors__); fix the prompt or schema and rerun"
        )
    return messages


def _totals_lines(totals: MergeTotals) -> list[str]:
    requests = totals.requests
    complete = totals.rows - totals.rows_with_errors
    failed = requests[REQUEST_FAILED] + requests[INVALID]
    invalid = f" ({requests[INVALID]} invalid JSON)" if requests[INVALID] else ""
    lines = [
        f"rows: {totals.rows} ({complete} complete, {totals.rows_with_errors} with errors)",
        f"requests: {sum(requests.values())} ({requests[SUCCEEDED]} succeeded, {failed} failed"
        f"{invalid}, {requests[EXPIRED]} expired, {requests[CANCELED]} canceled, "
        f"{requests[MISSING]} missing, {requests[RUNNING]} still running)",
    ]
    if totals.usage_reported:
        lines.append(f"tokens: {totals.input_tokens:,} input, {totals.output_tokens:,} output")
        lines.append(_cost_line(totals))
    else:
        lines.append("tokens: not reported by the provider (cost unknown)")
    return lines


def _cost_line(totals: MergeTotals) -> str:
    known = 0.0
    unknown: list[str] = []
    for model, (tin, tout) in totals.tokens_by_model.items():
        cost = totals.prices.usage_cost(model, tin, tout)
        if cost is None:
            unknown.append(model or "unknown model")
        else:
            known += cost
    if len(unknown) == len(totals.tokens_by_model):
        return f"cost: unknown (no batch price for {', '.join(unknown)}; see {PRICES_ENV})"
    note = f"; no price for {', '.join(unknown)}" if unknown else ""
    return (
        f"cost: {format_usd(known)} at batch prices (approximate, prices as of "
        f"{PRICES_AS_OF}{note})"
    )


def _echo_running(fetch: FetchReport, total: int) -> None:
    if fetch.running:
        click.echo(
            f"{len(fetch.running)} of {total} batches still running; the file is partial, "
            "rerun merge later or use --wait"
        )


# -- retry ----------------------------------------------------------------------------------


def batch_retry(
    config: MMirageConfig, only_retryable: bool = False, *, run_dir: RunDir | None = None
) -> int:
    """Resubmit the requests whose latest outcome is failed, expired, canceled or missing."""
    run_dir = run_dir or RunDir.of(config)

    def work() -> int:
        report = retry_failed(config, run_dir, only_retryable=only_retryable)
        for message in [*report.fetch.errors, *report.lost]:
            _error(message)
        if report.resubmitted:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(report.by_reason.items()))
            click.echo(
                f"resubmitted {report.resubmitted} request(s) as {len(report.new_batches)} "
                f"batch(es) (run id {report.run_id}): {reasons}"
            )
        else:
            which = "retryable request" if only_retryable else "request"
            click.echo(f"nothing to resubmit: no {which} of a finished batch failed")
        if report.fetch.running:
            click.echo(
                f"{len(report.fetch.running)} batch(es) still running were left alone; "
                "retry again once they finish"
            )
        return 1 if report.fetch.errors or report.lost else 0

    return _one_sentence(work)


__all__ = ["batch_check", "batch_merge", "batch_retry"]
