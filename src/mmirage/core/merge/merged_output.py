"""The merged dataset: every published shard in order, each row rebuilt with its results.

Memory is O(1) in rows: one group of published rows and its results at a time, the rest is in
the results store.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_kit.gcquiet import quiet_gc
from mmirage.core.merge.row_rebuild import MergeTotals, RowBuilder
from mmirage.core.merge.shards import config_shards
from mmirage.core.process.batch.cost import PriceBook
from mmirage.core.process.batch.errors import CollectorError
from mmirage.core.process.batch.results_store import ResultsStore
from mmirage.core.shard.published import is_current, shard_damage
from mmirage.core.shard.remote_output import shard_output
from mmirage.core.writer.formats import FormatError, write_dataset
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig


def published_shards(config: MMirageConfig, run_dir: RunDir) -> list[Any]:
    """Every dataset's published shards in order, or a ``CollectorError`` naming the first
    shards that are not published yet, were computed under another configuration (their
    placeholders may stand for requests this one no longer asks), or are damaged: not the
    size, rows and checksum recorded when they were published."""
    lp = config.loading_params
    fp = run_dir.fingerprint
    ordered: list[Any] = []
    for ds in lp.datasets:
        shards, missing = config_shards(lp, ds)
        if missing:
            raise CollectorError(
                f"{ds.output_dir}: shard(s) {', '.join(map(str, missing))} of "
                f"{lp.num_shards} are not published yet; finish them with 'mmirage run CONFIG' "
                "and merge again"
            )
        stale = [
            str(s.shard_id) for s in shards if not is_current(shard_output(lp, ds, s.shard_id), fp)
        ]
        if stale:
            raise CollectorError(
                f"{ds.output_dir}: shard(s) {', '.join(stale)} of {lp.num_shards} were computed "
                "under another configuration (or are being computed again); run 'mmirage run "
                "CONFIG' first (it computes them again, submitting only the requests that "
                "changed) and merge again"
            )
        ordered.extend(shards)
    for shard_id in range(lp.num_shards):  # as the live merge: merging reads them whole anyway
        if (damage := shard_damage(config, shard_id, full=True)) is not None:
            raise CollectorError(damage)
    return ordered


def merged_rows(
    config: MMirageConfig, store: ResultsStore, totals: MergeTotals, shards: Sequence[Any]
) -> Iterator[list[dict[str, Any]]]:
    """The rebuilt rows, one group of published rows (and one store lookup) at a time."""
    builder = RowBuilder(config)
    for shard in shards:
        for batch in shard.batches():
            pending = [builder.pending(row) for row in batch]
            ids = [cid for found in pending for _, cid in found]
            outcomes = store.lookup(ids) if ids else {}
            yield [
                builder.rebuild(r, p, outcomes, totals) for r, p in zip(batch, pending, strict=True)
            ]


def write_merged(
    config: MMirageConfig, run_dir: RunDir, store: ResultsStore, output_path: str | Path
) -> MergeTotals:
    """Write the merged dataset to ``output_path`` as one ordered JSONL file, atomically."""
    shards = published_shards(config, run_dir)
    dest = Path(output_path).expanduser()
    if any(dest.resolve() == Path(s.path).resolve() for s in shards):
        raise CollectorError(
            f"--output-path {dest} is one of the published shards it reads; choose another file"
        )
    totals = MergeTotals(prices=PriceBook.from_config(config))
    try:
        # Rarer collections, start-up objects frozen out of them (as a run's shards have):
        # each row makes a few dicts that die with its group, so sweeps found nothing.
        with quiet_gc():
            write_dataset(lambda: merged_rows(config, store, totals, shards), dest, "jsonl")
    except FormatError as exc:
        raise CollectorError(
            f"{exc}; the shard may be damaged, rerun it with --recompute"
        ) from None
    return totals


__all__ = ["merged_rows", "published_shards", "write_merged"]
