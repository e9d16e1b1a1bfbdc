"""Run one shard: stream rows → variables → outputs in order → output_schema → part file.

Per row, the part file (and so the published shard) holds the rendered row plus three columns:

* ``__row_key__`` — ``"<dataset index>:<split or ''>:<row id>"``, the same on every run;
* ``__errors__`` — ``null`` for a good row, else ``{<output name>: <one sentence>}`` (``__row__``
  for a row that could not be read or lacks an input, ``__schema__`` when the schema cannot be
  rendered). A row whose output failed keeps its source columns and every schema field that
  can be rendered without the outputs it lacks; only the fields that read a failed (or, after
  it, uncomputed) output are ``null``. A row that cannot be read, or lacks an input, gets
  ``null`` for every schema field. A failed output's later outputs are not computed (they
  would mostly depend on the failed one, and nobody should pay for them);
* ``__usage__`` — ``{"input_tokens", "output_tokens"}`` summed over the row's outputs;
* ``__vars__`` — only on rows still waiting for a ``batch_api`` result: the variables the
  output_schema reads (placeholders included), so that ``merge`` can render the row again
  once the results are home.

A processor's configured fallback (custom ``fallback_value``) is used as the output's value and
its reason is still recorded in ``__errors__``, so no fallback is silent.

Rows are processed a group at a time (``batch_size`` rows, more when a processor wants more to
keep its concurrency busy) and a checkpoint follows every group. Every answer goes to the
shard's answer store as it arrives (``answers.py``) and stays there: a killed shard resumes at
its last checkpoint, and a shard whose configuration changed is computed again, without paying
again for an answer whose request did not change. A finished shard is skipped on rerun unless
``force`` (compute it again from the stored answers) or its configuration changed; ``fresh``
asks every request again (new samples); ``reset_attempts`` gives a failed shard its retry
budget back without discarding anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from mmirage.core.loader import open_datasets, plan_shard
from mmirage.core.process.base import Processor, RunContext
from mmirage.core.process.batch.cost import PriceBook
from mmirage.core.process.factory import build_processor  # built-ins import on first use
from mmirage.core.shard.answers import AnswerStore
from mmirage.core.shard.dataset_run import group_rows, run_dataset
from mmirage.core.shard.live_counters import RequestCounter
from mmirage.core.shard.output import ShardOutput
from mmirage.core.shard.published import verified_finished
from mmirage.core.shard.reading import source_offsets
from mmirage.core.shard.remote_output import shard_output
from mmirage.core.shard.report import ShardReport
from mmirage.core.shard.row_retry import retry_failed_rows
from mmirage.core.shard.rows import RowWorker, processor_key
from mmirage.core.shard.state import (
    HEARTBEAT_EVERY_S,
    RUNNING,
    SUCCESS,
    ShardConflictError,
    ShardStatus,
    is_stale,
    shard_lock,
)
from mmirage.core.shard.stop import (
    cancelled_on_stop,
    drained_first,
    interruption,
    run_stoppable,
)
from mmirage.core.shard.submissions import ShardSubmissions
from mmirage.core.writer.helper import ArrowHelper
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

logger = logging.getLogger(__name__)

FORCED_BY = "forced_by"  # status.json: the run id whose --recompute/--fresh the shard is doing


def run_shard(
    config: MMirageConfig,
    shard_id: int,
    *,
    processors: Mapping[str, Processor] | None = None,
    force: bool = False,
    fresh: bool = False,
    reset_attempts: bool = False,
    retry_rows: bool = False,
    run_id: str | None = None,
    export_prompts: str | None = None,
    run_dir: RunDir | None = None,
) -> ShardReport:
    """Run shard ``shard_id`` of every dataset and publish it; see the module docstring.

    ``processors`` (keyed by ``processor_key``) are used as given and not closed; ``None``
    builds them from the config and closes them at the end. Raises on failure, after recording
    it in status.json; the next call resumes from the last checkpoint. ``run_id`` names this
    run in batch receipts (default: a new one); ``export_prompts`` makes ``batch_api``
    processors write their requests there instead of submitting them. ``retry_rows``: in a
    published shard, compute again the rows that failed for a retryable reason (``row_retry``).
    ``run_dir``: the pipeline's ``RunDir``, when the caller has it (else built here).
    """
    return run_stoppable(
        arun_shard(
            config,
            shard_id,
            processors=processors,
            force=force,
            fresh=fresh,
            reset_attempts=reset_attempts,
            retry_rows=retry_rows,
            run_id=run_id,
            export_prompts=export_prompts,
            run_dir=run_dir,
        )
    )


async def arun_shard(
    config: MMirageConfig,
    shard_id: int,
    *,
    processors: Mapping[str, Processor] | None = None,
    force: bool = False,
    fresh: bool = False,
    reset_attempts: bool = False,
    retry_rows: bool = False,
    run_id: str | None = None,
    export_prompts: str | None = None,
    run_dir: RunDir | None = None,
) -> ShardReport:
    lp = config.loading_params
    if not 0 <= shard_id < lp.num_shards:
        raise ValueError(f"shard id must be between 0 and {lp.num_shards - 1}, got {shard_id}")
    # One run per shard at a time: two would both pay for every row and interleave their
    # lines in the part file. The lock dies with its process, so a killed run never blocks.
    run_dir = run_dir or RunDir.of(config)
    with shard_lock(run_dir.shard_lock_path(shard_id), shard_id), cancelled_on_stop():
        store = AnswerStore(run_dir.answers_dir, run_dir.shard_name(shard_id))
        context = RunContext(
            run_id=run_id or new_run_id(),
            shard_id=shard_id,
            run_dir=run_dir,
            export_prompts=export_prompts,
            fresh=fresh,
            submitted=ShardSubmissions(store),
        )
        with store:
            return await _arun_shard_locked(
                config,
                context,
                store,
                processors=processors,
                force=force or fresh,
                fresh=fresh,
                reset_attempts=reset_attempts,
                retry_rows=retry_rows,
            )


def new_run_id() -> str:
    """A fresh run id: six hex digits. ``mmirage run`` draws one and hands it to every shard
    process it starts, so that their batch receipts share it."""
    import uuid

    return uuid.uuid4().hex[:6]


async def _arun_shard_locked(
    config: MMirageConfig,
    context: RunContext,
    store: AnswerStore,
    *,
    processors: Mapping[str, Processor] | None,
    force: bool,
    fresh: bool,
    reset_attempts: bool,
    retry_rows: bool,
) -> ShardReport:
    shard_id = context.shard_id
    lp = config.loading_params
    started = time.monotonic()
    report = ShardReport(shard_id, lp.num_shards)
    fp = context.run_dir.fingerprint
    status = ShardStatus(config, context.run_dir, shard_id)
    if force and status.data.get(FORCED_BY) == context.run_id:
        # This invocation's --recompute/--fresh began here already: its retry (a requeued
        # SLURM task, a retried attempt) resumes that work instead of starting it over.
        force = fresh = False
    elif force:
        status.data[FORCED_BY] = context.run_id
    # Opened before anything is marked running: a bad path is the user's error, not a failure.
    sources = open_datasets(lp.datasets, config.config_path)
    shards = plan_shard(sources, lp.num_shards, shard_id)
    offsets = source_offsets(sources)
    if shard_id == 0:  # said once per run, not by every shard
        for source in sources:
            if source.num_rows == 0:
                logger.warning("dataset %s holds no rows: nothing to compute", source.config.path)
    outputs = [shard_output(lp, s.source.config, shard_id) for s in shards]
    force = _check_can_run(status, outputs, fp, shard_id, force)
    context = dataclasses.replace(context, recompute=force, fresh=fresh)
    if force:  # computed again, from the stored answers; the retry budget too
        for out in outputs:
            out.begin_recompute()  # the published shard stays readable until replaced
    if force or reset_attempts:
        status.data["attempts"] = 0
    done = verified_finished(outputs, shards, fp, repair=reset_attempts)
    retrying = retry_rows and any(c is not None and c.rows_retryable for c in done)
    if status.data.get("status") == SUCCESS and all(done) and not retrying:
        report.skipped = True
        for ckpt in done:
            report.add(ckpt)  # type: ignore[arg-type]  # all() checked
        report.published = [str(out.published) for out in outputs]
        return report

    record_only = all(done) and not retrying
    if record_only:  # published, but status.json was lost: record it as is
        processors = {}
    # Arrow shards are converted by a helper process, which imports pyarrow meanwhile.
    with ArrowHelper() if record_only else ArrowHelper.start(lp.output_format) as arrow:
        for out in outputs:
            out.arrow = arrow
        async with _processors(config, processors, context) as procs:
            requests = RequestCounter(procs.values(), PriceBook.from_config(config))
            status.start(fp)
            beating = asyncio.create_task(_heartbeat(status))
            try:
                store.open(fresh=fresh)  # after status.json: a full disk names that file first
                for shard, out, finished in zip(shards, outputs, done, strict=True):
                    if finished is None:
                        await run_dataset(
                            config, shard, offsets, out, fp, procs, status, report, store
                        )
                    elif retry_rows and finished.rows_retryable:
                        worker = RowWorker(config, shard, offsets, procs, store)
                        rows = group_rows(config, procs)
                        report.add(await retry_failed_rows(worker, out, rows, report.notes, fp))
                        report.resumed_rows += finished.rows_done - finished.rows_retryable
                    else:
                        report.add(finished)
                    report.published.append(str(out.published))
            except BaseException as exc:  # KeyboardInterrupt and SIGTERM too: never leave "running"
                report.runtime_seconds = time.monotonic() - started
                report.requests = requests.totals().as_json()
                interrupted = isinstance(
                    exc, asyncio.CancelledError | KeyboardInterrupt | SystemExit
                )
                error = interruption() if interrupted else f"{type(exc).__name__}: {exc}"
                try:
                    for out in outputs:
                        out.close()
                finally:  # recorded even when closing fails
                    status.finish(error, _stats(report))
                raise
            finally:
                beating.cancel()
            # Recorded before the processors close (a launched server takes seconds to stop): a
            # SIGTERM then must not leave a published shard "running".
            report.runtime_seconds = time.monotonic() - started
            report.requests = requests.totals().as_json()
            if summary := store.summary():
                report.notes.append(summary)
            status.update_counters(report.counters())
            status.finish(None, _stats(report))
    return report


def _check_can_run(
    status: ShardStatus,
    outputs: list[ShardOutput],
    fp: str,
    shard_id: int,
    force: bool,
) -> bool:
    """Whether the shard must be computed again (``force``, or its configuration changed);
    raises when it cannot run now."""
    data = status.data
    if data.get("status") == RUNNING and not is_stale(data):
        raise ShardConflictError(
            f"shard {shard_id} is running (pid {data.get('pid')} on {data.get('hostname')}, "
            f"heartbeat {data.get('heartbeat')}); wait for it to end, or until it is reported "
            "stale by 'mmirage check'"
        )
    if force:
        return True
    changed = data.get("fingerprint") not in (None, fp) or any(
        (c := out.finished()) is not None and c.fingerprint not in ("", fp) for out in outputs
    )
    if not changed:
        return False
    logger.info(
        "shard %d: the configuration changed since it was computed; computing it again, "
        "from stored answers (and batches already submitted) where its requests did not change",
        shard_id,
    )
    return True


@contextlib.asynccontextmanager
async def _processors(
    config: MMirageConfig, given: Mapping[str, Processor] | None, context: RunContext
) -> AsyncIterator[Mapping[str, Processor]]:
    built: dict[str, Processor] = {}
    try:
        if given is None:
            for output in config.processing_params.outputs:
                pc = config.processor_for(output)
                if processor_key(pc) not in built:
                    built[processor_key(pc)] = build_processor(pc, context)
        procs = built if given is None else given
        # At the time limit, what the processors have in flight comes back before the stop.
        with drained_first(lambda: asyncio.gather(*(p.drain() for p in procs.values()))):
            yield procs
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
        "requests": report.requests,
    }
