"""``mmirage retry`` on a published shard: compute again the rows that failed for a retryable
reason, pay only for their failed outputs, and publish the shard again.

Such rows carry a ``__retry__`` marker (``retry_marker``) with the outputs that had
succeeded. They are read again from the source and go through the same ``RowWorker`` as a
run, a processing group at a time; the succeeded outputs are pinned in the answer store
first, so the worker takes them the way it takes any answer already paid for, and only the
failed outputs are requested. New answers are stored as they arrive: a retry killed midway
pays for nothing twice.

Then the shard is rewritten: every row in its place, the recomputed ones replaced (with the
tokens their failed attempts spent added to their usage), and published again atomically
with a new fingerprint (``integrity``). A marked row that cannot be computed again (its
marker cannot be read, its source row is gone) keeps its error and loses its marker: it
counts as failed for good, so that ``retry`` never loops on it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from mmirage.core.loader import DatasetShard, Row
from mmirage.core.shard.output import ShardCheckpoint, ShardOutput
from mmirage.core.shard.reading import row_by_key
from mmirage.core.shard.retry_marker import Marker, read_marker
from mmirage.core.shard.row_usage import add_spent
from mmirage.core.shard.rows import RowWorker
from mmirage.core.shard.tally import tally
from mmirage.core.writer.formats import iter_rows, jsonl_lines
from mmirage.rundir import RETRY, ROW_KEY

logger = logging.getLogger(__name__)


async def retry_failed_rows(
    worker: RowWorker, out: ShardOutput, group_rows: int, notes: list[str], fingerprint: str
) -> ShardCheckpoint:
    """Compute the marked rows of ``out``'s published shard again and publish it anew under
    the configuration ``fingerprint``; returns the new checkpoint (``notes`` gets one line
    saying what happened)."""
    published = out.find_published()
    if published is None:
        raise FileNotFoundError(f"{out.dir / out.name}: the published shard is gone")
    retried = out.part.with_name(f"{out.name}.retried.jsonl")
    ckpt: ShardCheckpoint | None = None
    try:
        count = await _recompute(worker, published, retried, group_rows)
        for proc in worker.procs.values():  # a batch_api processor submits what it spooled
            if note := await proc.finish():
                notes.append(note)
        ckpt = _rewrite(out, published, retried, fingerprint)
    finally:
        out.close()
        retried.unlink(missing_ok=True)
    still = ckpt.rows_retryable
    notes.append(
        f"re-ran {count} row(s) that had failed for a retryable reason: {count - still} "
        f"now succeed, {still} failed again"
        + (" (run 'mmirage retry' again later)" if still else "")
    )
    return ckpt


def _marked(published: Path, shard: DatasetShard) -> Iterator[tuple[Row, Marker]]:
    """The marked rows that can be computed again: their source row and marker, in order."""
    for batch in iter_rows(published):
        for row in batch:
            if row.get(RETRY) is None:
                continue
            marker = read_marker(row[RETRY])
            item = row_by_key(shard, str(row.get(ROW_KEY)))
            if marker is None or not isinstance(item, Row):
                logger.warning(
                    "%s: row %s cannot be computed again (its %s marker or its source row "
                    "cannot be read); it keeps its error",
                    published,
                    row.get(ROW_KEY),
                    RETRY,
                )
                continue
            yield item, marker


async def _recompute(worker: RowWorker, published: Path, sink: Path, group_rows: int) -> int:
    """Compute the marked rows again, a group at a time, into ``sink`` (JSONL, in order)."""
    count = 0
    group: list[tuple[Row, Marker]] = []
    with open(sink, "wb") as f:

        async def flush() -> None:
            records = await worker.process([row for row, _ in group])
            for record, (_, marker) in zip(records, group, strict=True):
                add_spent(record, marker.spent_input_tokens, marker.spent_output_tokens)
            f.write(jsonl_lines(records))
            group.clear()

        for row, marker in _marked(published, worker.shard):
            key = worker.key_of(row)
            for name, result in marker.kept.items():
                worker.store.pin(key, name, result)  # taken instead of asked again
            group.append((row, marker))
            count += 1
            if len(group) >= group_rows:
                await flush()
        if group:
            await flush()
    return count


def _rewrite(out: ShardOutput, published: Path, retried: Path, fp: str) -> ShardCheckpoint:
    """The published rows in order, each recomputed one in its place; published atomically."""
    ckpt = ShardCheckpoint(fingerprint=fp)
    out.start_rewrite()
    with open(retried, "rb") as f:
        fresh = (orjson.loads(line) for line in f)
        upcoming = next(fresh, None)
        for batch in iter_rows(published):
            rows: list[dict[str, Any]] = []
            for row in batch:
                marked = row.get(RETRY) is not None
                if marked and upcoming is not None and upcoming[ROW_KEY] == row.get(ROW_KEY):
                    row, upcoming = upcoming, next(fresh, None)
                    tally(ckpt, row)
                    rows.append(row)
                    continue
                # Not computed again (or a null column read back from Parquet or HF): a
                # marker left here would make every retry try this row again.
                row.pop(RETRY, None)
                tally(ckpt, row)
                rows.append(row)
            out.append(rows)
    out.republish(ckpt)
    return ckpt
