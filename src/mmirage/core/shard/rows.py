"""One processing group of a shard: rows → variables → outputs in order → published records.

``RowWorker.process`` takes a group of rows (unreadable ones in their place) and returns one
record per row, in order, as the part file holds them (see ``runner`` for the columns). Results
an interrupted run already paid for come from the journal instead of a new request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmirage.core.loader import BadRow, DatasetShard
from mmirage.core.process.base import OutputRequest, OutputResult, Processor
from mmirage.core.render.prompts import render_prompt
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


@dataclass
class _RowWork:
    index: int
    key: str
    source_index: int
    row: dict[str, Any]
    variables: dict[str, Any]
    errors: dict[str, str] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0
    retryable: set[str] = field(default_factory=set)  # outputs whose error a retry may fix
    paid: dict[str, tuple[int, int]] = field(default_factory=dict)  # succeeded output: tokens


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
        self.dataset_index = shard.dataset_index  # read per row: a plain attribute
        self.extractor = VariableExtractor.for_params(pp, shard.source.image_base_path)
        self.image_names = [i.name for i in pp.inputs if i.type == "image"]
        self.renderer = OutputRenderer(pp.output_schema, remove_columns=pp.remove_columns)
        self.output_names = [o.name for o in pp.outputs]
        # The schema's batch_api variables: only their placeholders call for __vars__.
        batch = {o.name for o in pp.outputs if o.type == "batch_api"}
        self.batch_outputs = [n for n in self.renderer.variables if n in batch]

    def key_of(self, item: Item) -> str:
        return f"{self.dataset_index}:{item.split or ''}:{item.row_id}"

    async def process(self, items: list[Item]) -> list[dict[str, Any]]:
        records: list[dict[str, Any] | None] = [None] * len(items)
        live: list[_RowWork] = []
        for index, item in enumerate(items):
            if isinstance(item, BadRow):
                error = f"line {item.line} of {item.file} is not a valid row: {item.error}"
                records[index] = self._failed(self.key_of(item), {}, {"__row__": error}, 0, 0)
                self.count.finish(failed=True)
                continue
            try:
                variables = self.extractor.extract(item.data)
            except RowError as exc:
                records[index] = self._failed(self.key_of(item), item.data, {"__row__": str(exc)})
                self.count.finish(failed=True)
                continue
            source_index = self.offsets[(self.dataset_index, item.split)] + item.row_id
            live.append(_RowWork(index, self.key_of(item), source_index, item.data, variables))
        for output in self.config.processing_params.outputs:
            await self._output(output, [w for w in live if output.name not in w.errors])
        for w in live:
            records[w.index] = self._record(w)
        return [r for r in records if r is not None]

    def _record(self, w: _RowWork) -> dict[str, Any]:
        """The row as published: rendered in full when every output has a value (a fallback
        counts), else with ``None`` only where the schema reads an output it lacks."""
        missing = [name for name in self.output_names if name not in w.variables]
        if not missing:
            try:
                rendered = self.renderer.render(w.variables, w.row)
            except RowError as exc:
                self.count.failed += not w.errors  # counted as a good row when it finished
                w.errors["__schema__"] = str(exc)
                return self._failed(w.key, w.row, w.errors, w.input_tokens, w.output_tokens)
            rendered.update(self._meta(w))  # a new dict: no copy needed
            return rendered
        rendered, schema_error = self.renderer.render_partial(w.variables, w.row, missing)
        if schema_error is not None:
            w.errors.setdefault("__schema__", schema_error)
        rendered.update(self._meta(w))
        return rendered

    async def _output(self, output: OutputVar, work: list[_RowWork]) -> None:
        """Compute one output for the rows still going (a row whose earlier output failed
        without a fallback gets no later output: it would mostly depend on the failed one)."""
        work = [w for w in work if all(name in w.variables for name in w.errors)]
        template: str | None = getattr(output, "prompt", None)  # custom outputs have none
        requests: list[OutputRequest] = []
        sent: list[_RowWork] = []
        for w in work:
            journaled = self.journal.get(w.key, output.name)
            if journaled is not None:  # paid for by an interrupted run
                self._take(w, output.name, journaled)
                continue
            try:
                prompt = None if template is None else render_prompt(template, w.variables)
            except RowError as exc:
                w.errors[output.name] = str(exc)
                self.count.finish(failed=True)  # no later output runs for this row
                continue
            images = image_urls(w.variables, self.image_names) if template is not None else []
            requests.append(
                OutputRequest(
                    w.key, output.name, prompt, images, w.variables, w.row, w.source_index
                )
            )
            sent.append(w)
        if not requests:
            return
        proc = self.procs[processor_key(self.config.processor_for(output))]
        journal = proc.journal_results
        got = 0
        results = proc.stream(output, requests)
        try:
            async for index, result in results:
                w = sent[index]
                if journal:
                    self.journal.add(w.key, output.name, result)
                self._take(w, output.name, result)
                got += 1
        finally:
            # If journaling failed, the processor hears of it now (and sends no more).
            close = getattr(results, "aclose", None)  # a plain async iterator has none
            if close is not None:
                await close()
        self.journal.flush()
        if got != len(requests):
            raise RuntimeError(
                f"the processor of output '{output.name}' answered {got} results for "
                f"{len(requests)} requests"
            )

    def _take(self, w: _RowWork, name: str, result: OutputResult) -> None:
        if result.error is not None and not result.fallback:
            self.count.finish(failed=True)  # no later output runs for this row
        elif name == self.output_names[-1]:
            self.count.finish(failed=bool(w.errors) or result.error is not None)
        w.input_tokens += result.input_tokens
        w.output_tokens += result.output_tokens
        if result.error is not None:
            w.errors[name] = result.error
            if result.retryable:
                w.retryable.add(name)
        else:
            w.paid[name] = (result.input_tokens, result.output_tokens)
        if result.error is None or result.fallback:
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

    def _meta(self, w: _RowWork) -> dict[str, Any]:
        usage = {"input_tokens": w.input_tokens, "output_tokens": w.output_tokens}
        meta: dict[str, Any] = {ROW_KEY: w.key, ERRORS: w.errors or None, USAGE: usage}
        batch = self.batch_outputs
        if batch and any(is_placeholder(w.variables.get(n)) for n in batch):
            meta[VARS] = {n: w.variables[n] for n in self.renderer.variables if n in w.variables}
        if w.errors and w.retryable.issuperset(w.errors):
            meta[RETRY] = retry_marker(w.variables, w.paid, w.input_tokens, w.output_tokens)
        return meta
