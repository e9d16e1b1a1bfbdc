"""The rows table (a page of one shard's rows from an offset, filtered) and one row's page."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mmirage.core.process.batch.cost import PriceBook
from mmirage.core.render.prompts import render_prompt
from mmirage.core.render.variables import compile_key
from mmirage.rundir import ERRORS, USAGE
from mmirage.view.context import ViewContext
from mmirage.view.failures import error_kind, row_failures
from mmirage.view.html import clipped, link, page, table, text, usd
from mmirage.view.rowfiles import FoundRow, RowFile, one_row, row_file, row_files, rows_from

PAGE_ROWS = 50
FILTERS = ("all", "ok", "failed")


@dataclass(frozen=True)
class RowsQuery:
    dataset: int
    shard: int
    where: str | None
    offset: int
    status: str
    column: str
    search: str


def _matches(row: Mapping[str, Any], query: RowsQuery) -> bool:
    failed = bool(row_failures(row))
    if (query.status == "ok" and failed) or (query.status == "failed" and not failed):
        return False
    if query.search:
        value = row.get(query.column) if query.column else row
        return query.search.lower() in clipped(value, 100_000).lower()
    return True


def rows_page(context: ViewContext, query: RowsQuery) -> str:
    files = row_files(context.config, query.dataset, query.shard)
    title = f"Rows of dataset {query.dataset}, shard {query.shard}"
    if not files:
        return page(title, "<p class='muted'>no rows written yet</p>", token=context.token)
    file = next((f for f in files if f.where == query.where), files[0])
    found = list(
        itertools.islice(
            (r for r in rows_from(file, query.offset) if _matches(r.row, query)), PAGE_ROWS + 1
        )
    )
    shown, more = found[:PAGE_ROWS], found[PAGE_ROWS:]
    columns = _columns(context, shown)
    rows = [
        [
            link(
                "/row",
                str(r.offset),
                dataset=file.dataset,
                shard=file.shard,
                where=file.where,
                offset=r.offset,
                token=context.token,
            )
        ]
        + [clipped(r.row.get(c), 120) for c in columns]
        for r in shown
    ]
    nav = _switch(context, files, query)
    if more:
        nav += " " + link(
            "/rows",
            "next page →",
            dataset=query.dataset,
            shard=query.shard,
            where=file.where,
            offset=more[0].offset,
            status=query.status,
            column=query.column,
            q=query.search,
            token=context.token,
        )
    body = (
        f"<p>{text(file.where)} file {text(file.path.name)} ({text(file.fmt)}), from offset "
        f"{query.offset:,}</p>{_form(context, query, file)}<p>{nav}</p>"
        + (
            table(("offset", *columns), rows, "rows")
            if rows
            else "<p class='muted'>no matching row in this stretch</p>"
        )
    )
    return page(title, body, token=context.token)


def _columns(context: ViewContext, rows: list[FoundRow]) -> list[str]:
    names: dict[str, None] = {}
    for r in rows[:5]:
        names.update(dict.fromkeys(str(k) for k in r.row))
    return [n for n in names if n not in (USAGE,)][:8]


def _switch(context: ViewContext, files: list[RowFile], query: RowsQuery) -> str:
    return " ".join(
        link(
            "/rows",
            f"{f.where} file",
            dataset=f.dataset,
            shard=f.shard,
            where=f.where,
            token=context.token,
        )
        for f in files
    )


def _form(context: ViewContext, query: RowsQuery, file: RowFile) -> str:
    options = "".join(
        f'<option value="{s}"{" selected" if s == query.status else ""}>{s}</option>'
        for s in FILTERS
    )
    hidden: dict[str, object] = {
        "dataset": query.dataset,
        "shard": query.shard,
        "where": file.where,
    }
    if context.token:
        hidden["token"] = context.token
    fields = "".join(
        f'<input type="hidden" name="{k}" value="{text(v)}">' for k, v in hidden.items()
    )
    return (
        f'<form method="get" action="/rows">{fields}'
        f'<select name="status">{options}</select> column <input name="column" '
        f'value="{text(query.column)}"> contains <input name="q" value="{text(query.search)}">'
        ' <button type="submit">filter</button></form>'
    )


def row_page(context: ViewContext, dataset: int, shard: int, where: str, offset: int) -> str:
    file = row_file(context.config, dataset, shard, where)
    found = one_row(file, offset)
    row = found.row
    pp = context.config.processing_params
    inputs = {i.name: compile_key(i.key).search(row) for i in pp.inputs}
    failures = row_failures(row)
    variables = {**inputs, **{o.name: row.get(o.name) for o in pp.outputs}}
    parts = [
        "<h2>Inputs</h2>",
        table(
            ("variable", "value"), ([text(k), f"<pre>{text(v)}</pre>"] for k, v in inputs.items())
        ),
    ]
    parts.append("<h2>Outputs</h2>")
    for output in pp.outputs:
        prompt = getattr(output, "prompt", "") or ""
        try:
            sent = render_prompt(prompt, variables) if prompt else "(no prompt)"
        except Exception as exc:  # shown instead of the prompt
            sent = f"(the prompt cannot be rendered again from this row: {exc})"
        if output.name in failures:
            answer = (
                f'<p class="error">error ({text(error_kind(failures[output.name]))}): '
                f"{text(failures[output.name])}</p>"
            )
        else:
            answer = f"<pre>{text(row.get(output.name))}</pre>"
        parts.append(
            f"<h3>{text(output.name)}</h3><p>prompt as sent:</p><pre>{text(sent)}</pre>"
            f"<p>answer:</p>{answer}"
        )
    usage: dict[str, Any] = row[USAGE] if isinstance(row.get(USAGE), dict) else {}
    parts += [
        "<h2>Usage and cost</h2>",
        f"<pre>{text(usage)}</pre>",
        f"<p>cost at list prices: {text(usd(_row_cost(context, usage)))}</p>",
        "<h2>The row as written</h2>",
        f"<pre>{text(row)}</pre>",
    ]
    if row.get(ERRORS) and not failures:
        parts.append(f"<p class='error'>{text(row.get(ERRORS))}</p>")
    title = f"Row {dataset}/{shard}@{offset} ({where} file)"
    return page(title, "".join(parts), token=context.token)


def _row_cost(context: ViewContext, usage: Mapping[str, Any]) -> float | None:
    models = {_model(p) for p in context.config.processors} - {None}
    if len(models) != 1:
        return None  # several models: a row's summed usage cannot be priced
    book = PriceBook.from_config(context.config)
    return book.usage_cost(
        models.pop(),
        int(usage.get("input_tokens") or 0),
        int(usage.get("output_tokens") or 0),
        batch=context.config.uses_batch_api,
    )


def _model(processor: Any) -> str | None:
    provider = getattr(processor, "provider_config", None)
    model = getattr(provider, "model", None) or getattr(processor, "model", None)
    return str(model) if model else None
