"""The landing page: shards, rates and cost over time, failures by kind, the last rows."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from mmirage.core.shard.state import RUNNING
from mmirage.rundir import ERRORS
from mmirage.view.batches import batch_lines
from mmirage.view.context import ViewContext, last_rows
from mmirage.view.html import age, clipped, link, page, table, text, usd
from mmirage.view.shards import ShardLine, Totals, read_shards
from mmirage.view.svg import line_chart
from mmirage.view.timeline import timeline


def _card(label: str, value: str) -> str:
    return f'<div class="card">{text(label)}<b>{text(value)}</b></div>'


def _cards(totals: Totals, pending: int | None) -> str:
    states = ", ".join(f"{n} {s}" for s, n in sorted(totals.states.items()))
    cost = usd(totals.cost_usd)
    done = totals.rows_done
    if totals.cost_usd and pending and done:
        cost += f" (estimate at the end: {usd(totals.cost_usd * (done + pending) / done)})"
    if totals.unpriced:
        cost += f" (no price for {', '.join(totals.unpriced)})"
    return (
        '<div class="cards">'
        + "".join(
            [
                _card("shards", states),
                _card("rows done", f"{done:,}"),
                _card(
                    "rows failed", f"{totals.rows_failed:,} ({totals.rows_retryable:,} retryable)"
                ),
                _card("rows pending", "unknown" if pending is None else f"{pending:,}"),
                _card("tokens in / out", f"{totals.input_tokens:,} / {totals.output_tokens:,}"),
                _card("cost so far (list prices)", cost),
            ]
        )
        + "</div>"
    )


def _shard_table(context: ViewContext, lines: list[ShardLine]) -> str:
    datasets = range(len(context.config.loading_params.datasets))
    # Built by hand, not by ``link``: 1,000 shards' links, and every value here is a number.
    token = "&amp;token=" + quote(context.token, safe="") if context.token else ""
    rows = []
    for s in lines:
        browse = " ".join(
            f'<a href="/rows?dataset={d}&amp;shard={s.shard_id}{token}">rows of dataset {d}</a>'
            for d in datasets
        )
        pending = "?" if s.rows_pending is None else f"{s.rows_pending:,}"
        rows.append(
            [
                str(s.shard_id),
                f'<span class="state-{escape(s.state)}">{escape(s.state)}</span>',
                f'<span class="num">{s.rows_done:,}</span>',
                f'<span class="num">{s.rows_failed:,}</span>',
                f'<span class="num">{pending}</span>',
                age(s.heartbeat_age_s),
                escape(s.attempts),
                browse,
                clipped(s.error, 120) if s.error else "",
            ]
        )
    header = (
        "shard",
        "state",
        "done",
        "failed",
        "pending",
        "heartbeat",
        "attempts",
        "rows",
        "error",
    )
    return table(header, rows, "shards")


def _batches(context: ViewContext) -> str:
    lines = batch_lines(context.run_dir)
    if not lines:
        return "<p class='muted'>no provider batch submitted yet</p>"
    header = ("provider", "batch", "processor", "submitted", "requests", "status", "ok", "failed")
    rows = [
        [
            text(b.provider),
            text(b.batch_id),
            text(b.processor),
            text(b.submitted_at),
            text(b.requests),
            text(b.status),
            text(b.succeeded),
            text(b.failed),
        ]
        for b in lines
    ]
    return table(header, rows, "batches")


def _failures(context: ViewContext) -> str:
    groups = context.failures.groups()
    if not groups:
        counted = "counting…" if context.failures.passes == 0 else "no failed row"
        return f"<p class='muted'>{counted}</p>"
    rows = []
    for kind, g in groups.items():
        example = clipped(g.example, 160)
        if g.where is not None:
            d, k, where, offset = g.where
            example = link(
                "/row",
                g.example[:160],
                dataset=d,
                shard=k,
                where=where,
                offset=offset,
                token=context.token,
            )
        rows.append([text(kind), text(f"{g.count:,}"), text(f"{g.retryable:,}"), example])
    return table(("kind", "rows", "retryable", "example"), rows, "failures")


def _last(context: ViewContext) -> str:
    outputs = [o.name for o in context.config.processing_params.outputs]
    rows = []
    for file, found in last_rows(context):
        errors = found.row.get(ERRORS) or {}
        answers = []
        for name in outputs:
            value = errors.get(name) if isinstance(errors, dict) and name in errors else None
            shown = f"error: {value}" if value is not None else found.row.get(name, "")
            answers.append(f"<b>{text(name)}</b>: {clipped(shown, 200)}")
        label = f"{file.dataset}/{file.shard}@{found.offset}"
        rows.append(
            [
                link(
                    "/row",
                    label,
                    dataset=file.dataset,
                    shard=file.shard,
                    where=file.where,
                    offset=found.offset,
                    token=context.token,
                ),
                "<br>".join(answers),
            ]
        )
    if not rows:
        return "<p class='muted'>no row finished yet</p>"
    return table(("row", "answers"), rows, "last-rows")


def landing_page(context: ViewContext) -> str:
    lines, totals = read_shards(
        context.config, context.run_dir, context.sizes.sizes, context.statuses
    )
    sizes = context.sizes.sizes
    pending = sum(s.rows_pending or 0 for s in lines) if sizes else None
    series = timeline(lines)
    span = series.width * len(series.rows_per_s)
    charts = (
        '<div class="charts">'
        + line_chart("rows/s", series.rows_per_s, span)
        + line_chart("tokens/s", series.tokens_per_s, span)
        + line_chart("cost so far (USD)", series.cost_usd, span, "$")
        + "</div>"
    )
    body = [
        f"<p>pipeline {text(context.run_dir.pipeline_id)}, state folder "
        f"{text(str(context.run_dir.state))}</p>",
        _cards(totals, pending),
        "<h2>Over time</h2>",
        charts,
    ]
    if context.config.uses_batch_api:
        body += ["<h2>Provider batches</h2>", _batches(context)]
    body += [
        "<h2>Failures by kind</h2>",
        _failures(context),
        "<h2>Last 20 finished rows</h2>",
        _last(context),
        "<h2>Shards</h2>",
        _shard_table(context, lines),
    ]
    live = totals.states.get(RUNNING, 0) > 0
    return page(
        "Pipeline " + context.run_dir.pipeline_id, "".join(body), refresh=live, token=context.token
    )
