"""One dataset of a shard, from its checkpoint to its published file: rows are read, handed to
the processors a group at a time (two groups in flight) and appended to the part file, in
order, while the next groups run; answers go to the shard's answer store as they arrive, and
the part file is checkpointed every so often (``landing``)."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llm_kit.gcquiet import quiet_gc
from mmirage.core.loader import DatasetShard
from mmirage.core.process.base import Processor
from mmirage.core.process.batch.cost import PriceBook
from mmirage.core.shard.answers import AnswerStore
from mmirage.core.shard.landing import Landing
from mmirage.core.shard.live_counters import RequestCounter
from mmirage.core.shard.output import ShardCheckpoint, ShardOutput
from mmirage.core.shard.progress import RowProgress
from mmirage.core.shard.reading import Item, groups_from
from mmirage.core.shard.recovery import locator
from mmirage.core.shard.report import ShardReport
from mmirage.core.shard.rows import RowWorker
from mmirage.core.shard.state import ShardStatus

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

logger = logging.getLogger("mmirage.core.shard.runner")  # the name users filter on


def group_rows(config: MMirageConfig, procs: Mapping[str, Processor]) -> int:
    """Rows per group: ``batch_size``, more when a processor needs more to stay busy."""
    wanted = [int(p.group_rows) for p in procs.values()]
    return max([config.loading_params.batch_size, *wanted])


async def run_dataset(
    config: MMirageConfig,
    shard: DatasetShard,
    offsets: Mapping[tuple[int, str | None], int],
    out: ShardOutput,
    fp: str,
    procs: Mapping[str, Processor],
    status: ShardStatus,
    report: ShardReport,
    store: AnswerStore,
) -> ShardCheckpoint:
    """Run ``shard`` (one dataset of the shard) from its checkpoint to its published file."""
    rows_per_group = group_rows(config, procs)
    ckpt = out.open(fp, locator(shard))
    if ckpt.rows_done:
        logger.info("shard %d: resuming %s after %d rows", shard.shard_id, out.part, ckpt.rows_done)
    report.resumed_rows += ckpt.rows_done
    bar = RowProgress(
        shard.num_rows,
        f"shard {shard.shard_id} · dataset {shard.dataset_index}",
        ckpt.rows_done,
        ckpt.rows_failed,
        requests=RequestCounter(procs.values(), PriceBook.from_config(config)),
        interval_s=config.execution_params.progress_interval_seconds,
        where=(shard.shard_id, shard.dataset_index),
    )
    if ckpt.range_index < len(shard.ranges):
        # Where this dataset's unfinished rows start, globally: a processor may need to know
        # what an interrupted run already sent for them (the batch spool does).
        r = shard.ranges[ckpt.range_index]
        first = offsets[(shard.dataset_index, r.split)] + (
            r.start if ckpt.next_row_id is None else ckpt.next_row_id
        )
        for proc in procs.values():
            proc.resume_at(first)
    worker = RowWorker(config, shard, offsets, procs, store, bar.count)
    # Two groups in flight: the next one is read and rendered while the current one's requests
    # are out, so request slots never idle during the CPU work between groups. (Concurrency
    # stays bounded: the processors share their connection pools.) Groups land in order.
    in_flight: collections.deque[tuple[int, list[Item], asyncio.Task[Any]]] = collections.deque()

    # A group's records are appended and checkpointed by a task of their own, one group after
    # the other: the next group starts as soon as its predecessor's results are in, not after
    # that fsync, so the connections never wait for the disk.
    landing: asyncio.Task[None] | None = None

    lands = Landing(out, ckpt, status, report)

    async def land_oldest() -> None:
        nonlocal landing
        range_index, items, task = in_flight.popleft()
        records = await task
        if landing is not None:
            await landing  # groups land in order
        landing = asyncio.create_task(lands.land(range_index, items, records))

    groups = groups_from(shard, ckpt, rows_per_group, config.loading_params.on_bad_row)
    # One quiet collector for the whole dataset, not one per group (llm_kit's sinks each take
    # it): between two groups it would otherwise unfreeze, and sweep every row's objects.
    with quiet_gc():
        try:
            bar.start()
            for range_index, items in groups:
                in_flight.append((range_index, items, asyncio.create_task(worker.process(items))))
                if len(in_flight) >= 2:
                    await land_oldest()
            while in_flight:
                await land_oldest()
            if landing is not None:
                await landing
            for proc in procs.values():
                note = await proc.finish()
                if note:
                    report.notes.append(note)
            lands.publish()
        finally:
            bar.close()
            for _, _, task in in_flight:
                task.cancel()
            if landing is not None:
                # A group being checkpointed is let finish before the files close (its rows are
                # written already); a failure of its own was raised above, or yields to this one.
                await asyncio.wait([landing])
                if not landing.cancelled():
                    landing.exception()  # retrieved: asyncio would log it as lost
            if not ckpt.complete and (landing is None or not _failed(landing)):
                lands.checkpoint_now()
    report.add(ckpt)
    return ckpt


def _failed(task: asyncio.Task[None]) -> bool:
    return task.cancelled() or task.exception() is not None
