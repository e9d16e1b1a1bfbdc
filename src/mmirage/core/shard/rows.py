"""One processing group of a shard: rows → variables → outputs in order → published records.

``RowWorker.process`` takes a group of rows (unreadable ones in their place) and returns one
record per row, in order, as the part file holds them (see ``runner`` for the columns). An
answer already paid for (by an interrupted run, an earlier configuration that asked the same,
a retried row's kept outputs) comes from the answer store instead of a new request, and every
new answer goes there as it arrives.

A group is held as columns (``_Group``), its requests too (``RequestBatch``): what a run costs
beyond llm_kit's own work is mostly Python calls made per row, so the common case (a row
that succeeds) makes as few of them as it can.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, cast

from mmirage.config.reserved import RESERVED_COLUMNS
from mmirage.core.loader import BadRow, DatasetShard, Row
from mmirage.core.process.base import OutputResult, Processor, RequestBatch, Take
from mmirage.core.render.prompts import prompt_renderer
from mmirage.core.render.renderer import OutputRenderer, is_placeholder
from mmirage.core.render.variables import RowError, VariableExtractor, image_urls
from mmirage.core.shard.answers import AnswerStore, keeps
from mmirage.core.shard.progress import RowCount
from mmirage.core.shard.reading import Item
from mmirage.core.shard.refusals import refused_record, reserved_column_error
from mmirage.core.shard.request_keys import RequestKeys
from mmirage.core.shard.retry_marker import retry_marker
from mmirage.core.shard.row_usage import unknown_usage
from mmirage.rundir import ERRORS, RETRY, ROW_KEY, USAGE, VARS

# A row's columns, read by ``map`` (a loop in C) over a group's rows.
_ROW_ID, _DATA, _SPLIT = attrgetter("row_id"), attrgetter("data"), attrgetter("split")

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.config.processing_params import OutputVar
    from mmirage.config.processors import ProcessorConfig


def processor_key(processor: ProcessorConfig) -> str:
    """How ``run_shard(processors=...)`` names a processor: its ``name``, else its ``type``."""
    return processor.name or processor.type


class _Group:
    """The readable rows of one group as columns: position ``p`` is one row in every list."""

    __slots__ = (
        "errors",
        "index",
        "input_tokens",
        "keys",
        "output_tokens",
        "paid",
        "retryable",
        "rows",
        "sources",
        "variables",
    )

    def __init__(
        self,
        index: Sequence[int],
        rows: list[Row],
        data: list[dict[str, Any]],
        variables: list[dict[str, Any]],
        dataset: int,
        split_starts: Mapping[str | None, int],
    ) -> None:
        self.index = index  # where the row's record goes among the group's records
        # ``RowWorker.key_of`` and the source_index, column by column: a group's rows are of
        # one split but where it changes, and a loop in C (``map``) makes no Python step per row.
        splits = set(map(_SPLIT, rows))
        if len(splits) == 1:
            (split,) = splits
            ids = list(map(_ROW_ID, rows))
            self.keys = list(map(f"{dataset}:{split or ''}:".__add__, map(str, ids)))
            self.sources = list(map(split_starts[split].__add__, ids))
        else:
            self.keys = [f"{dataset}:{row.split or ''}:{row.row_id}" for row in rows]
            self.sources = [split_starts[row.split] + row.row_id for row in rows]
        self.rows = data
        self.variables = variables
        self.input_tokens = [0] * len(rows)
        self.output_tokens = [0] * len(rows)
        # Only for the rows concerned: most rows have no error.
        self.errors: dict[int, dict[str, str]] = {}
        self.retryable: dict[int, set[str]] = {}  # outputs whose error a retry may fix
        self.paid: dict[int, dict[str, tuple[int, int]]] = {}  # succeeded outputs: tokens

    def tokens(self, p: int) -> tuple[int, int]:
        return self.input_tokens[p], self.output_tokens[p]

    def going(self) -> Sequence[int]:
        """The rows that get the next output: not those whose earlier output failed without
        a fallback (a later output would mostly depend on the failed one)."""
        every = range(len(self.keys))
        if not self.errors:
            return every
        errors, variables = self.errors, self.variables
        return [p for p in every if all(e in variables[p] for e in errors.get(p, ()))]


class RowWorker:
    """One dataset's per-group logic (extractor and renderer built once)."""

    def __init__(
        self,
        config: MMirageConfig,
        shard: DatasetShard,
        offsets: Mapping[tuple[int, str | None], int],
        procs: Mapping[str, Processor],
        store: AnswerStore,
        count: RowCount | None = None,
    ) -> None:
        pp = config.processing_params
        self.count = count if count is not None else RowCount()  # rows finished, for the bar
        self.config = config
        self.shard = shard
        self.offsets = offsets
        self.procs = procs
        self.store = store
        self.dataset_index = shard.dataset_index
        self.extractor = VariableExtractor.for_params(pp, shard.source.image_base_path)
        self.image_names = [i.name for i in pp.inputs if i.type == "image"]
        self.request_keys = RequestKeys(self.image_names)
        self.renderer = OutputRenderer(pp.output_schema, remove_columns=pp.remove_columns)
        # Source columns are published (unless remove_columns): none may be named as mmirage's.
        self.reserved = None if pp.remove_columns else RESERVED_COLUMNS
        self.output_names = [o.name for o in pp.outputs]
        # What each succeeded output cost, for a failed row's retry marker: with one output,
        # a failed row has no succeeded output.
        self.track_paid = len(self.output_names) > 1
        # Each prompt compiled once (custom outputs have none).
        self.prompts = {
            o.name: prompt_renderer(prompt)
            for o in pp.outputs
            if (prompt := getattr(o, "prompt", None)) is not None
        }
        # split -> its first source_index
        self._split_starts = {s: at for (d, s), at in offsets.items() if d == self.dataset_index}
        # The schema's batch_api variables: only their placeholders call for __vars__.
        batch = {o.name for o in pp.outputs if o.type == "batch_api"}
        self.batch_outputs = [n for n in self.renderer.variables if n in batch]

    def key_of(self, item: Item) -> str:
        return f"{self.dataset_index}:{item.split or ''}:{item.row_id}"

    async def process(self, items: list[Item]) -> list[dict[str, Any]]:
        records: list[dict[str, Any] | None] = [None] * len(items)
        readable: Sequence[int] = range(len(items))
        rows: list[Row] = items  # type: ignore[assignment]  # unless some row is unreadable:
        if set(map(type, items)) != {Row}:
            rows = [item for item in items if isinstance(item, Row)]
            readable = [at for at, item in enumerate(items) if isinstance(item, Row)]
            for at, item in enumerate(items):
                if isinstance(item, BadRow):
                    why = f"line {item.line} of {item.file} is not a valid row: {item.error}"
                    records[at] = self._failed(self.key_of(item), {}, {"__row__": why})
                    self.count.finish(failed=True)
        data = list(map(_DATA, rows))
        # One loop in C per group: a kept source column must not take a name of mmirage's own.
        if self.reserved is not None and not all(map(self.reserved.isdisjoint, data)):
            raise reserved_column_error(rows, self.shard.source)
        values, broken = self.extractor.extract_each(data)
        if broken:
            names = self.output_names
            for at, exc in broken.items():
                row = rows[at]
                records[readable[at]] = refused_record(
                    self.key_of(row), row.data, str(exc), self.extractor, self.renderer, names
                )
                self.count.finish(failed=True)
            readable = [r for at, r in enumerate(readable) if at not in broken]
            rows = [row for at, row in enumerate(rows) if at not in broken]
            data = [row for at, row in enumerate(data) if at not in broken]
            values = [v for v in values if v is not None]
        extracted: list[dict[str, Any]] = values  # type: ignore[assignment]  # None: broken
        g = _Group(readable, rows, data, extracted, self.dataset_index, self._split_starts)
        for output in self.config.processing_params.outputs:
            await self._output(output, g)
        return self._records(g, records)

    async def _output(self, output: OutputVar, g: _Group) -> None:
        """Compute one output for the rows still going."""
        name = output.name
        render = self.prompts.get(name)  # custom outputs have no prompt
        prompts, going = self._prompts(g, g.going(), name, render)
        proc = self.procs[processor_key(self.config.processor_for(output))]
        identity = self.request_keys.identity(output, proc)
        digests: list[bytes] | None = None
        if identity is not None and going:
            by_row = None if render is not None else g.rows  # no prompt: the row decides
            digests = self.request_keys.digests(
                identity, going, prompts, g.keys, g.variables, by_row
            )
        if self.store.lookups and going:  # pinned results too, for any output
            going, prompts, digests = self._stored(g, going, name, prompts, digests)
        if identity is not None:
            self.store.asked += len(going)
        if not going:
            return
        if len(going) == len(g.keys):  # every row: the group's own columns
            keys, values, rows, sources = g.keys, g.variables, g.rows, g.sources
        else:
            keys = [g.keys[p] for p in going]
            values = [g.variables[p] for p in going]
            rows = [g.rows[p] for p in going]
            sources = [g.sources[p] for p in going]
        images = self.image_names if render is not None else None
        urls = [image_urls(v, images) for v in values] if images else None
        requests = RequestBatch(name, keys, prompts, urls, values, rows, sources)
        await proc.deliver(output, requests, self._taker(g, going, name, digests))
        self.store.flush()

    def _stored(
        self,
        g: _Group,
        going: Sequence[int],
        name: str,
        prompts: list[str | None],
        digests: list[bytes] | None,
    ) -> tuple[list[int], list[str | None], list[bytes] | None]:
        """The requests the store cannot answer; the stored answers are taken here."""
        found = self.store.find(name, [g.keys[p] for p in going], digests)
        if not found:
            return list(going), prompts, digests
        for at, result in found.items():
            self._take(g, going[at], name, result)
        still = [at for at in range(len(going)) if at not in found]
        kept = None if digests is None else [digests[at] for at in still]
        return [going[at] for at in still], [prompts[at] for at in still], kept

    def _prompts(
        self,
        g: _Group,
        going: Sequence[int],
        name: str,
        render: Callable[[Mapping[str, Any]], str] | None,
    ) -> tuple[list[str | None], Sequence[int]]:
        """The prompts of the rows ``going`` and the rows they are for: a row whose prompt
        cannot render fails here, and gets no later output."""
        if render is None:
            return [None] * len(going), going
        variables = g.variables
        try:
            return [render(variables[p]) for p in going], going
        except RowError:
            pass  # some row's prompt cannot render: row by row, to fail only those
        prompts: list[str | None] = []
        kept: list[int] = []
        for p in going:
            try:
                prompts.append(render(variables[p]))
            except RowError as exc:
                g.errors.setdefault(p, {})[name] = str(exc)
                self.count.finish(failed=True)
            else:
                kept.append(p)
        return prompts, kept

    def _taker(
        self, g: _Group, going: Sequence[int], name: str, digests: list[bytes] | None
    ) -> Take:
        """``take(index, result)`` (and ``take.answer``) for the processor: the result of
        request ``index`` stored the moment it arrives (a failed write ends the call: it
        sends no more), then kept for its row. ``digests``: the requests' keys in the answer
        store (None: this processor's answers are not stored)."""
        store = self.store
        add = store.add_answer if digests is not None else None
        digest_of = digests or []
        keys, variables, errors = g.keys, g.variables, g.errors
        input_tokens, output_tokens, count = g.input_tokens, g.output_tokens, self.count
        last = name == self.output_names[-1]
        inline = not self.track_paid  # else every success notes what it cost: ``_take``
        take_result = self._take

        def answer(index: int, value: Any, tokens_in: int, tokens_out: int) -> None:
            p = going[index]
            if add is not None:
                add(digest_of[index], keys[p], name, value, tokens_in, tokens_out)
            if inline:  # ``_take``'s common case, without its call
                variables[p][name] = value
                input_tokens[p] += tokens_in
                output_tokens[p] += tokens_out
                if last:
                    count.done += 1
                    if errors:  # (a row with an earlier output's error)
                        count.failed += p in errors
            else:
                take_result(
                    g, p, name, OutputResult(value, None, False, False, tokens_in, tokens_out)
                )

        def take(index: int, result: OutputResult) -> None:
            if result.error is None and result.finish_reason is None:
                answer(index, result.value, result.input_tokens, result.output_tokens)
                return
            p = going[index]
            if add is not None and keeps(result):  # a transient failure is asked again
                store.add(digest_of[index], keys[p], name, result)
            take_result(g, p, name, result)

        return Take(take, answer)

    def _take(self, g: _Group, p: int, name: str, result: OutputResult) -> None:
        g.input_tokens[p] += result.input_tokens
        g.output_tokens[p] += result.output_tokens
        error = result.error
        if error is None:
            g.variables[p][name] = result.value
            if self.track_paid:
                g.paid.setdefault(p, {})[name] = (result.input_tokens, result.output_tokens)
            if name == self.output_names[-1]:
                self.count.finish(failed=p in g.errors)
            return
        if not result.fallback or name == self.output_names[-1]:
            self.count.finish(failed=True)  # without a fallback no later output runs for it
        g.errors.setdefault(p, {})[name] = error
        if result.retryable:
            g.retryable.setdefault(p, set()).add(name)
        if result.fallback:
            g.variables[p][name] = result.value

    def _records(self, g: _Group, records: list[dict[str, Any] | None]) -> list[dict[str, Any]]:
        """The group's records: each row as published, in its place among ``records`` (those
        of the rows that failed earlier are there already); rendered in full when every
        output has a value (a fallback counts), else with ``None`` only where the schema
        reads an output it lacks."""
        names, errors = self.output_names, g.errors
        # A row without errors has every output's value.
        partial = {p: m for p in errors if (m := [n for n in names if n not in g.variables[p]])}
        whole: Sequence[int] = range(len(g.keys))
        values, rows = g.variables, g.rows
        if partial:
            whole = [p for p in whole if p not in partial]
            values, rows = [values[p] for p in whole], [rows[p] for p in whole]
        rendered, broken = self.renderer.render_each(values, rows)
        keys, index, input_tokens, output_tokens = g.keys, g.index, g.input_tokens, g.output_tokens
        extras = bool(self.batch_outputs)
        if not (errors or broken or extras) and len(rendered) == len(records):
            # The common group (every row read and answered, nothing to add): in its order.
            good = cast(list[dict[str, Any]], rendered)  # nothing broke: no None
            usage = zip(keys, input_tokens, output_tokens, strict=True)
            for published, (key, used_in, used_out) in zip(good, usage, strict=True):
                published[ROW_KEY] = key
                published[ERRORS] = None
                published[USAGE] = {"input_tokens": used_in, "output_tokens": used_out}
            return good
        for at, (p, record) in enumerate(zip(whole, rendered, strict=True)):
            if record is None:
                self.count.failed += p not in errors  # counted as a good row when it finished
                row_errors = errors.setdefault(p, {})
                row_errors["__schema__"] = str(broken[at])
                records[index[p]] = self._failed(keys[p], g.rows[p], row_errors, *g.tokens(p))
                continue
            record[ROW_KEY] = keys[p]
            record[ERRORS] = errors.get(p)
            record[USAGE] = {"input_tokens": input_tokens[p], "output_tokens": output_tokens[p]}
            if extras or p in errors:
                self._extras(record, g, p)
            records[index[p]] = record
        for p, missing in partial.items():
            record, schema_error = self.renderer.render_partial(g.variables[p], g.rows[p], missing)
            if schema_error is not None:
                errors[p].setdefault("__schema__", schema_error)
            record[ROW_KEY] = keys[p]
            record[ERRORS] = errors[p]
            record[USAGE] = {"input_tokens": input_tokens[p], "output_tokens": output_tokens[p]}
            records[index[p]] = self._extras(record, g, p)
        return [r for r in records if r is not None]

    def _failed(
        self,
        key: str,
        row: Mapping[str, Any],
        errors: dict[str, str],
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> dict[str, Any]:
        base: dict[str, Any] = {} if self.renderer.remove_columns else dict(row)
        base.update(dict.fromkeys(self.renderer.schema))
        usage = {"input_tokens": input_tokens, "output_tokens": output_tokens}
        return {**base, ROW_KEY: key, ERRORS: errors, USAGE: usage}

    def _extras(self, record: dict[str, Any], g: _Group, p: int) -> dict[str, Any]:
        """``record`` with what merge or retry need: the variables a pending batch placeholder
        renders from, a retryable failure's marker."""
        variables, errors = g.variables[p], g.errors.get(p)
        batch = self.batch_outputs
        if batch and any(is_placeholder(variables.get(n)) for n in batch):
            record[VARS] = {n: variables[n] for n in self.renderer.variables if n in variables}
            unknown_usage(record, *g.tokens(p))
        if errors and g.retryable.get(p, set()).issuperset(errors):
            record[RETRY] = retry_marker(variables, g.paid.get(p, {}), *g.tokens(p))
        return record
