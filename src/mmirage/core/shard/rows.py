"""One processing group of a shard: rows → variables → outputs in order → published records.

``RowWorker.process`` takes a group of rows (unreadable ones in their place) and returns one
record per row, in order, as the part file holds them (see ``runner`` for the columns). Results
an interrupted run already paid for come from the journal instead of a new request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mmirage.core.loader import BadRow, DatasetShard
from mmirage.core.process.base import OutputRequest, OutputResult, Processor
from mmirage.core.render.prompts import prompt_renderer
from mmirage.core.render.renderer import OutputRenderer, is_placeholder
from mmirage.core.render.variables import RowError, VariableExtractor, image_urls
from mmirage.core.shard.journal import ResultJournal
from mmirage.core.shard.progress import RowCount
from mmirage.core.shard.reading import Item
from mmirage.core.shard.retry_marker import retry_marker
from mmirage.rundir import ERRORS, RETRY, ROW_KEY, USAGE, VARS

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.config.processing_params import OutputVar
    from mmirage.config.processors import ProcessorConfig


def processor_key(processor: ProcessorConfig) -> str:
    """How ``run_shard(processors=...)`` names a processor: its ``name``, else its ``type``."""
    return processor.name or processor.type


class _RowWork:
    """One row on its way through the outputs (a plain class: rows are many)."""

    __slots__ = (
        "errors",
        "index",
        "input_tokens",
        "key",
        "output_tokens",
        "paid",
        "retryable",
        "row",
        "source_index",
        "variables",
    )

    def __init__(
        self,
        index: int,
        key: str,
        source_index: int,
        row: dict[str, Any],
        variables: dict[str, Any],
    ) -> None:
        self.index, self.key, self.source_index = index, key, source_index
        self.row, self.variables = row, variables
        self.errors: dict[str, str] = {}
        self.input_tokens = self.output_tokens = 0
        self.retryable: set[str] = set()  # outputs whose error a retry may fix
        self.paid: dict[str, tuple[int, int]] = {}  # succeeded output: tokens


class RowWorker:
    """One dataset's per-group logic (extractor and renderer built once)."""

    def __init__(
        self,
        config: MMirageConfig,
        shard: DatasetShard,
        offsets: Mapping[tuple[int, str | None], int],
        procs: Mapping[str, Processor],
        journal: ResultJournal,
        count: RowCount | None = None,
    ) -> None:
        pp = config.processing_params
        self.count = count if count is not None else RowCount()  # rows finished, for the bar
        self.config = config
        self.shard = shard
        self.offsets = offsets
        self.procs = procs
        self.journal = journal
        self.dataset_index = shard.dataset_index
        self.extractor = VariableExtractor.for_params(pp, shard.source.image_base_path)
        self.image_names = [i.name for i in pp.inputs if i.type == "image"]
        self.renderer = OutputRenderer(pp.output_schema, remove_columns=pp.remove_columns)
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
        self._split_starts: dict[str | None, int] = {}  # split -> its first source_index
        # The schema's batch_api variables: only their placeholders call for __vars__.
        batch = {o.name for o in pp.outputs if o.type == "batch_api"}
        self.batch_outputs = [n for n in self.renderer.variables if n in batch]

    def key_of(self, item: Item) -> str:
        return f"{self.dataset_index}:{item.split or ''}:{item.row_id}"

    async def process(self, items: list[Item]) -> list[dict[str, Any]]:
        records: list[dict[str, Any] | None] = [None] * len(items)
        live: list[_RowWork] = []
        extract, starts, dataset = self.extractor.extract, self._split_starts, self.dataset_index
        for index, item in enumerate(items):
            if isinstance(item, BadRow):
                error = f"line {item.line} of {item.file} is not a valid row: {item.error}"
                records[index] = self._failed(self.key_of(item), {}, {"__row__": error}, 0, 0)
                self.count.finish(failed=True)
                continue
            try:
                variables = extract(item.data)
            except RowError as exc:
                records[index] = self._failed(self.key_of(item), item.data, {"__row__": str(exc)})
                self.count.finish(failed=True)
                continue
            split, row_id = item.split, item.row_id
            start = starts.get(split)
            if start is None:
                start = starts[split] = self.offsets[(dataset, split)]
            key = f"{dataset}:{split or ''}:{row_id}"
            live.append(_RowWork(index, key, start + row_id, item.data, variables))
        for output in self.config.processing_params.outputs:
            await self._output(output, live)
        for w in live:
            records[w.index] = self._record(w)
        return [r for r in records if r is not None]

    def _record(self, w: _RowWork) -> dict[str, Any]:
        """The row as published: rendered in full when every output has a value (a fallback
        counts), else with ``None`` only where the schema reads an output it lacks."""
        # A row without errors has every output's value.
        missing = [n for n in self.output_names if n not in w.variables] if w.errors else None
        if not missing:
            try:
                rendered = self.renderer.render(w.variables, w.row)
            except RowError as exc:
                self.count.failed += not w.errors  # counted as a good row when it finished
                w.errors["__schema__"] = str(exc)
                return self._failed(w.key, w.row, w.errors, w.input_tokens, w.output_tokens)
            return self._with_meta(rendered, w)
        rendered, schema_error = self.renderer.render_partial(w.variables, w.row, missing)
        if schema_error is not None:
            w.errors.setdefault("__schema__", schema_error)
        return self._with_meta(rendered, w)

    async def _output(self, output: OutputVar, work: list[_RowWork]) -> None:
        """Compute one output for the rows still going (a row whose earlier output failed
        without a fallback gets no later output: it would mostly depend on the failed one)."""
        name = output.name
        if any(w.errors for w in work):
            work = [w for w in work if all(e in w.variables for e in w.errors)]
        render = self.prompts.get(name)  # custom outputs have no prompt
        images = self.image_names if render is not None else None
        lookup = self.journal.get if self.journal.replays else None
        requests: list[OutputRequest] = []
        sent: list[_RowWork] = []
        for w in work:
            if lookup is not None:
                journaled = lookup(w.key, name)
                if journaled is not None:  # paid for by an interrupted run
                    self._take(w, name, journaled)
                    continue
            variables = w.variables
            try:
                prompt = None if render is None else render(variables)
            except RowError as exc:
                w.errors[name] = str(exc)
                self.count.finish(failed=True)  # no later output runs for this row
                continue
            urls = image_urls(variables, images) if images else []
            requests.append(
                OutputRequest(w.key, name, prompt, urls, variables, w.row, w.source_index)
            )
            sent.append(w)
        if not requests:
            return
        proc = self.procs[processor_key(self.config.processor_for(output))]
        journal = self.journal if proc.journal_results else None
        take_result = self._take

        def take(index: int, result: OutputResult) -> None:
            # Journaled the moment it arrives; a failed write ends the call (sends no more).
            w = sent[index]
            if journal is not None:
                journal.add(w.key, name, result)
            take_result(w, name, result)

        await proc.deliver(output, requests, take)
        self.journal.flush()

    def _take(self, w: _RowWork, name: str, result: OutputResult) -> None:
        w.input_tokens += result.input_tokens
        w.output_tokens += result.output_tokens
        error = result.error
        if error is None:
            w.variables[name] = result.value
            if self.track_paid:
                w.paid[name] = (result.input_tokens, result.output_tokens)
            if name == self.output_names[-1]:
                self.count.finish(failed=bool(w.errors))
            return
        if not result.fallback or name == self.output_names[-1]:
            self.count.finish(failed=True)  # without a fallback no later output runs for it
        w.errors[name] = error
        if result.retryable:
            w.retryable.add(name)
        if result.fallback:
            w.variables[name] = result.value

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

    def _with_meta(self, rendered: dict[str, Any], w: _RowWork) -> dict[str, Any]:
        """``rendered`` with the row's key, errors and usage, and what merge or retry need."""
        variables = w.variables
        rendered[ROW_KEY] = w.key
        rendered[ERRORS] = w.errors or None
        rendered[USAGE] = {"input_tokens": w.input_tokens, "output_tokens": w.output_tokens}
        batch = self.batch_outputs
        if batch and any(is_placeholder(variables.get(n)) for n in batch):
            rendered[VARS] = {n: variables[n] for n in self.renderer.variables if n in variables}
        if w.errors and w.retryable.issuperset(w.errors):
            rendered[RETRY] = retry_marker(variables, w.paid, w.input_tokens, w.output_tokens)
        return rendered
