"""What running shards here came to: each shard's outcome, and the run's final report."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from mmirage.errors import UserError, WorkFailed

if TYPE_CHECKING:
    from mmirage.core.shard.runner import ShardReport


@dataclass
class ShardOutcome:
    shard_id: int
    ok: bool = False
    stats: dict[str, Any] | None = None  # the shard's report, as --stats prints it
    problem: str | None = None  # why it did not succeed, for the final report
    user_error: bool = False  # a child stopped on a problem the user must fix (exit 2)


@dataclass(frozen=True)
class RunResult:
    """``finished``: every shard of ``shards`` succeeded (what follows, a merge or a wait for
    batches, may start); ``conclude()`` prints the final report and raises if the run failed."""

    finished: bool
    shards: list[int]
    conclude: Callable[[], None]


def describe(report: ShardReport) -> str:
    what = "already done, skipped" if report.skipped else f"done in {report.runtime_seconds:.1f}s"
    resumed = f", resumed after {report.resumed_rows}" if report.resumed_rows else ""
    # Batch outputs have no tokens until merge: say nothing rather than a misleading zero.
    tokens = report.input_tokens or report.output_tokens
    usage = f", tokens {report.input_tokens} in / {report.output_tokens} out" if tokens else ""
    return f"{what}: {report.rows_done} rows ({report.rows_failed} failed{resumed}){usage}"


def stats_json(per_shard: list[dict[str, Any]], *, tokens_known: bool) -> dict[str, Any]:
    """``--stats``: the shards' reports and their totals. Without ``tokens_known`` (batch
    outputs, counted only by the merge) tokens are null, not a misleading zero. Failed rows
    are also split: ``total_rows_retryable`` (``mmirage retry`` runs them again) and
    ``total_rows_failed_for_good`` (validation, truncated, refused…: a rerun buys the same).
    ``requests``: the live requests' retries by cause, cool-down, tokens and cost."""
    keys = ("rows_done", "rows_failed", "rows_retryable", "input_tokens", "output_tokens")
    totals: dict[str, int | None] = {
        f"total_{k}": sum(int(r.get(k) or 0) for r in per_shard) for k in keys
    }
    totals["total_rows_failed_for_good"] = max(
        0, (totals["total_rows_failed"] or 0) - (totals["total_rows_retryable"] or 0)
    )
    if not tokens_known:
        unknown = {"input_tokens": None, "output_tokens": None}
        per_shard = [{**r, **unknown} for r in per_shard]
        totals.update({f"total_{k}": None for k in unknown})
    from mmirage.core.shard.live_counters import aggregate_json, summed

    return {
        "per_shard": per_shard,
        "aggregate": {
            "shards": len(per_shard),
            **totals,
            "sum_runtime_seconds": round(
                sum(float(r.get("runtime_seconds") or 0.0) for r in per_shard), 3
            ),
            **aggregate_json(summed(r.get("requests") for r in per_shard)),
        },
    }


def requests_line(report: ShardReport) -> str | None:
    """The shard's live requests (retries by cause, cool-down, cost), when it sent any."""
    from mmirage.core.shard.live_counters import RequestTotals, retries_summary

    if not report.requests.get("live"):
        return None
    return retries_summary(RequestTotals.from_json(report.requests))


def conclude(outcomes: list[ShardOutcome], stats: bool, *, tokens_known: bool) -> None:
    """Print --stats, then raise ``UserError`` (a child hit a user error) or ``WorkFailed`` if
    any shard did not succeed, naming them and why (conflicts included, so none scrolls out of
    sight)."""
    if stats:
        reports = [o.stats for o in outcomes if o.stats is not None]
        click.echo(json.dumps(stats_json(reports, tokens_known=tokens_known), indent=2))
    bad = [o for o in outcomes if not o.ok]
    if not bad:
        _fail_on_failed_rows(outcomes)
        return
    for o in bad:
        click.echo(f"shard {o.shard_id}: {o.problem}", err=True)
    ids = [o.shard_id for o in bad]
    error = UserError if any(o.user_error for o in bad) else WorkFailed
    raise error(f"{len(bad)} of {len(outcomes)} shard(s) did not succeed: {ids}")


def _fail_on_failed_rows(outcomes: list[ShardOutcome]) -> None:
    """Every shard finished, but a row that failed is work that failed: naming one."""
    reports = [o.stats for o in outcomes if o.stats]
    failed = sum(int(r.get("rows_failed") or 0) for r in reports)
    if not failed:
        return
    first = next((r["first_row_error"] for r in reports if r.get("first_row_error")), None)
    example = f" (first: {first})" if first else ""
    retryable = min(failed, sum(int(r.get("rows_retryable") or 0) for r in reports))
    hints = []
    if retryable:
        hints.append(
            f"'mmirage retry CONFIG' computes again the {retryable} that failed for a retryable "
            "reason (rate limit, server error, timeout…)"
        )
    if failed - retryable:
        hints.append(
            f"{failed - retryable} failed for good (validation, truncated, refused…): a retry "
            "would buy the same answer; raise max_new_tokens, loosen the schema or fix the input"
        )
    hint = "".join(f"; {h}" for h in hints)
    raise WorkFailed(
        f"{failed} row(s) failed{example}; each is published with its reason in __errors__{hint}"
    )
