"""Run one shard: stream rows → variables → outputs in order → output_schema → part file.

Per row, the part file (and so the published shard) holds the rendered row plus three columns:

* ``__row_key__`` — ``"<dataset index>:<split or ''>:<row id>"``, the same on every run;
* ``__errors__`` — ``null`` for a good row, else ``{<output name>: <one sentence>}`` (``__row__``
  for a row that could not be read or lacks an input, ``__schema__`` when the schema cannot be
  rendered). A failed row keeps its source columns and gets ``null`` for every schema column;
  its later outputs are not computed (they would mostly depend on the failed one, and nobody
  should pay for them);
* ``__usage__`` — ``{"input_tokens", "output_tokens"}`` summed over the row's outputs.

A checkpoint follows every batch, so a killed shard resumes at the batch that was in flight:
rows of finished batches are never sent again (those of the interrupted batch are). A finished
shard is skipped on rerun unless ``force`` (recompute from scratch); ``reset_attempts`` gives a
failed shard its retry budget back without discarding anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmirage.core.loader import BadRow, DatasetShard, Row, open_datasets, plan_shard
from mmirage.core.process.base import OutputRequest, Processor
from mmirage.core.process.prompts import render_prompt
from mmirage.core.process.variables import RowError, VariableExtractor, image_urls
from mmirage.core.shard.output import Checkpoint, ShardOutput
from mmirage.core.shard.state import (
    HEARTBEAT_EVERY_S,
    RUNNING,
    SUCCESS,
    ShardConflictError,
    ShardStatus,
    fingerprint,
    is_stale,
    shard_lock,
    status_path,
)
from mmirage.core.writer.renderer import OutputRenderer

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.config.processing import OutputVar
    from mmirage.config.processors import ProcessorConfig

logger = logging.getLogger(__name__)

ROW_KEY, ERRORS, USAGE = "__row_key__", "__errors__", "__usage__"
_COUNTERS = ("rows_done", "rows_failed", "input_tokens", "output_tokens")


@dataclass
class ShardReport:
    shard_id: int
    num_shards: int
    skipped: bool = False  # already finished: nothing was run
    rows_done: int = 0
    rows_failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    resumed_rows: int = 0  # rows found done by an earlier, interrupted attempt
    runtime_seconds: float = 0.0
    published: list[str] = field(default_factory=list)

    def add(self, ckpt: Checkpoint) -> None:
        for name in _COUNTERS:
            setattr(self, name, getattr(self, name) + getattr(ckpt, name))

    def counters(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in _COUNTERS}


def processor_key(processor: ProcessorConfig) -> str:
    """How ``run_shard(processors=...)`` names a processor: its ``name``, else its ``type``."""
    return processor.name or processor.type


def run_shard(
    config: MMirageConfig,
    shard_id: int,
    *,
    processors: Mapping[str, Processor] | None = None,
    force: bool = False,
    reset_attempts: bool = False,
) -> ShardReport:
    """Run shard ``shard_id`` of every dataset and publish it; see the module docstring.

    ``processors`` (keyed by ``processor_key``) are used as given and not closed; ``None``
    builds them from the config and closes them at the end. Raises on failure, after recording
    it in status.json; the next call resumes from the last checkpoint.
    """
    return asyncio.run(
        arun_shard(
            config, shard_id, processors=processors, force=force, reset_attempts=reset_attempts
        )
    )


async def arun_shard(
    config: MMirageConfig,
    shard_id: int,
    *,
    processors: Mapping[str, Processor] | None = None,
    force: bool = False,
    reset_attempts: bool = False,
) -> ShardReport:
    lp = config.loading_params
    if not 0 <= shard_id < lp.num_shards:
        raise ValueError(f"shard id must be between 0 and {lp.num_shards - 1}, got {shard_id}")
    # One run per shard at a time: two would both pay for every row and interleave their
    # lines in the part file. The lock dies with its process, so a killed run never blocks.
    with shard_lock(status_path(config, shard_id).parent / "lock", shard_id):
        return await _arun_shard_locked(
            config, shard_id, processors=processors, force=force, reset_attempts=reset_attempts
        )


async def _arun_shard_locked(
    config: MMirageConfig,
    shard_id: int,
    *,
    processors: Mapping[str, Processor] | None,
    force: bool,
    reset_attempts: bool,
) -> ShardReport:
    lp = config.loading_params
    started = time.monotonic()
    report = ShardReport(shard_id, lp.num_shards)
    fp = fingerprint(config)
    status = ShardStatus(config, shard_id)
    # Opened before anything is marked running: a bad path is the user's error, not a failure.
    shards = plan_shard(open_datasets(lp.datasets), lp.num_shards, shard_id)
    outputs = [ShardOutput(s.output_dir, shard_id, lp.num_shards) for s in shards]
    _check_can_run(status, outputs, fp, shard_id, force)
    if force:  # start afresh: results and the retry budget
        for out in outputs:
            out.discard()
    if force or reset_attempts:
        status.data["attempts"] = 0
    done = [out.finished() for out in outputs]
    if status.data.get("status") == SUCCESS and all(done):
        report.skipped = True
        for ckpt in done:
            report.add(ckpt)  # type: ignore[arg-type]  # all() checked
        report.published = [str(out.published) for out in outputs]
        return report

    if all(done):  # published, but status.json was lost: record it without building anything
        processors = {}
    async with _processors(config, processors) as procs:
        status.start(fp)
        beating = asyncio.create_task(_heartbeat(status))
        try:
            for shard, out, finished in zip(shards, outputs, done, strict=True):
                if finished is None:
                    finished = await _run_dataset(config, shard, out, fp, procs, status, report)
                else:
                    report.add(finished)
                report.published.append(str(out.published))
        except BaseException as exc:  # KeyboardInterrupt and SIGTERM too: never leave "running"
            for out in outputs:
                out.close()
            report.runtime_seconds = time.monotonic() - started
            interrupted = isinstance(exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit)
            error = "interrupted" if interrupted else f"{type(exc).__name__}: {exc}"
            status.finish(error, _stats(report))
            raise
        finally:
            beating.cancel()
    report.runtime_seconds = time.monotonic() - started
    status.update_counters(report.counters())
    status.finish(None, _stats(report))
    return report


def _check_can_run(
    status: ShardStatus, outputs: list[ShardOutput], fp: str, shard_id: int, force: bool
) -> None:
    data = status.data
    if data.get("status") == RUNNING and not is_stale(data):
        raise ShardConflictError(
            f"shard {shard_id} is running (pid {data.get('pid')} on {data.get('hostname')}, "
            f"heartbeat {data.get('heartbeat')}); wait for it to end, or until it is reported "
            "stale by 'mmirage check'"
        )
    if force:
        return
    stale = data.get("fingerprint") not in (None, fp) or any(
        (c := out.finished()) is not None and c.fingerprint not in ("", fp) for out in outputs
    )
    if stale:
        raise ShardConflictError(
            f"shard {shard_id} has results from a different configuration (inputs, outputs, "
            "output_schema or datasets changed); rerun with --recompute to recompute it, "
            "or restore the previous configuration"
        )


@contextlib.asynccontextmanager
async def _processors(
    config: MMirageConfig, given: Mapping[str, Processor] | None
) -> AsyncIterator[Mapping[str, Processor]]:
    if given is not None:
        yield given
        return
    from mmirage.core.process.factory import build_processor  # heavy: only when running

    built: dict[str, Processor] = {}
    try:
        for output in config.processing_params.outputs:
            pc = config.processor_for(output)
            if processor_key(pc) not in built:
                built[processor_key(pc)] = build_processor(pc)
        yield built
    finally:
        for proc in built.values():
            await proc.aclose()


async def _heartbeat(status: ShardStatus) -> None:
    # Between checkpoints too: one slow batch must not make a live shard look dead.
    while True:
        await asyncio.sleep(HEARTBEAT_EVERY_S)
        status.beat(force=True)


def _stats(report: ShardReport) -> dict[str, Any]:
    rows = report.rows_done - report.resumed_rows
    runtime = report.runtime_seconds
    return {
        "runtime_seconds": round(runtime, 3),
        "rows_processed": rows,
        "throughput_rows_per_sec": round(rows / runtime, 3) if runtime > 0 else None,
        **report.counters(),
    }


Item = Row | BadRow


def _items(shard: DatasetShard, ckpt: Checkpoint) -> Iterator[tuple[int, Item]]:
    """The shard's rows from the checkpoint's cursor on, unreadable rows in their place."""
    bad: list[BadRow] = []
    for index, r in enumerate(shard.ranges):
        if index < ckpt.range_index:
            continue
        start = r.start
        if index == ckpt.range_index and ckpt.next_row_id is not None:
            start = ckpt.next_row_id
        rows = shard.source.iter_rows(
            start, r.stop, split=r.split, on_bad_row="skip", bad_rows=bad.append
        )
        for row in rows:
            yield from ((index, b) for b in bad)  # reported before the row that follows them
            bad.clear()
            yield index, row
        yield from ((index, b) for b in bad)
        bad.clear()


async def _run_dataset(
    config: MMirageConfig,
    shard: DatasetShard,
    out: ShardOutput,
    fp: str,
    procs: Mapping[str, Processor],
    status: ShardStatus,
    report: ShardReport,
) -> Checkpoint:
    batch_size = config.loading_params.batch_size
    ckpt = out.open(fp)
    if ckpt.rows_done:
        logger.info("shard %d: resuming %s after %d rows", shard.shard_id, out.part, ckpt.rows_done)
    report.resumed_rows += ckpt.rows_done
    worker = _BatchWorker(config, shard, procs)
    batch: list[tuple[int, Item]] = []

    async def flush() -> None:
        records = await worker.process([item for _, item in batch])
        out.append(records)
        ckpt.rows_done += len(records)
        for rec in records:
            ckpt.rows_failed += rec[ERRORS] is not None
            ckpt.input_tokens += rec[USAGE]["input_tokens"]
            ckpt.output_tokens += rec[USAGE]["output_tokens"]
        ckpt.range_index, last = batch[-1][0], batch[-1][1]
        ckpt.next_row_id = last.row_id + 1
        out.checkpoint(ckpt)
        status.update_counters({k: report.counters()[k] + getattr(ckpt, k) for k in _COUNTERS})
        status.beat()
        batch.clear()

    for entry in _items(shard, ckpt):
        batch.append(entry)
        if len(batch) >= batch_size:
            await flush()
    if batch:
        await flush()
    out.publish(ckpt)
    report.add(ckpt)
    return ckpt


@dataclass
class _RowWork:
    index: int
    key: str
    row: dict[str, Any]
    variables: dict[str, Any]
    errors: dict[str, str] = field(default_factory=dict)
    input_tokens: int = 0
    output_tokens: int = 0


class _BatchWorker:
    """One dataset's per-batch logic (extractor and renderer built once)."""

    def __init__(
        self, config: MMirageConfig, shard: DatasetShard, procs: Mapping[str, Processor]
    ) -> None:
        pp = config.processing_params
        self.config = config
        self.shard = shard
        self.procs = procs
        self.extractor = VariableExtractor(pp.inputs, image_base_path=shard.source.image_base_path)
        self.image_names = [i.name for i in pp.inputs if i.type == "image"]
        self.renderer = OutputRenderer(pp.output_schema, remove_columns=pp.remove_columns)

    def _key(self, item: Item) -> str:
        return f"{self.shard.dataset_index}:{item.split or ''}:{item.row_id}"

    async def process(self, items: list[Item]) -> list[dict[str, Any]]:
        records: list[dict[str, Any] | None] = [None] * len(items)
        live: list[_RowWork] = []
        for index, item in enumerate(items):
            if isinstance(item, BadRow):
                error = f"line {item.line} of {item.file} is not a valid row: {item.error}"
                records[index] = self._failed(self._key(item), {}, {"__row__": error}, 0, 0)
                continue
            try:
                variables = self.extractor.extract(item.data)
            except RowError as exc:
                records[index] = self._failed(self._key(item), item.data, {"__row__": str(exc)})
                continue
            live.append(_RowWork(index, self._key(item), item.data, variables))
        for output in self.config.processing_params.outputs:
            await self._output(output, [w for w in live if not w.errors])
        for w in live:
            if not w.errors:
                try:
                    rendered = self.renderer.render(w.variables, w.row)
                except RowError as exc:
                    w.errors["__schema__"] = str(exc)
                else:
                    records[w.index] = {**rendered, **self._meta(w.key, None, w)}
                    continue
            records[w.index] = self._failed(w.key, w.row, w.errors, w.input_tokens, w.output_tokens)
        return [r for r in records if r is not None]

    async def _output(self, output: OutputVar, work: list[_RowWork]) -> None:
        template: str | None = getattr(output, "prompt", None)  # custom outputs have none
        requests: list[OutputRequest] = []
        sent: list[_RowWork] = []
        for w in work:
            try:
                prompt = None if template is None else render_prompt(template, w.variables)
            except RowError as exc:
                w.errors[output.name] = str(exc)
                continue
            images = image_urls(w.variables, self.image_names) if template is not None else []
            requests.append(
                OutputRequest(w.key, output.name, prompt, images, dict(w.variables), w.row)
            )
            sent.append(w)
        if not requests:
            return
        proc = self.procs[processor_key(self.config.processor_for(output))]
        results = await proc.process(output, requests)
        if len(results) != len(requests):
            raise RuntimeError(
                f"the processor of output '{output.name}' answered {len(results)} results for "
                f"{len(requests)} requests"
            )
        for w, result in zip(sent, results, strict=True):
            w.input_tokens += result.input_tokens
            w.output_tokens += result.output_tokens
            if result.error is not None:
                w.errors[output.name] = result.error
            else:
                w.variables[output.name] = result.value

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

    @staticmethod
    def _meta(key: str, errors: dict[str, str] | None, w: _RowWork) -> dict[str, Any]:
        usage = {"input_tokens": w.input_tokens, "output_tokens": w.output_tokens}
        return {ROW_KEY: key, ERRORS: errors, USAGE: usage}
