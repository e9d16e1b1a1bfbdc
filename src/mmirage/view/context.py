"""What every page of one viewer reads from: the config, its run directory, and the two
background readers (shard sizes, failure counts)."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mmirage.view.failures import FailureCounter
from mmirage.view.rowfiles import FoundRow, RowFile, row_files, tail
from mmirage.view.shards import StatusCache
from mmirage.view.sizes import ShardSizes

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.rundir import RunDir


@dataclass
class ViewContext:
    config: MMirageConfig
    run_dir: RunDir
    sizes: ShardSizes
    failures: FailureCounter
    statuses: StatusCache
    token: str | None = None

    @classmethod
    def of(cls, config: MMirageConfig, run_dir: RunDir, token: str | None) -> ViewContext:
        sizes = ShardSizes(config)
        statuses = StatusCache(run_dir)
        context = cls(config, run_dir, sizes, FailureCounter(lambda: []), statuses, token)
        context.failures = FailureCounter(context.all_files)
        return context

    def start(self) -> None:
        self.sizes.start()
        self.failures.start()

    def all_files(self) -> Iterator[RowFile]:
        for dataset in range(len(self.config.loading_params.datasets)):
            for shard in range(self.run_dir.num_shards):
                yield from row_files(self.config, dataset, shard)


def last_rows(context: ViewContext, count: int = 20) -> list[tuple[RowFile, FoundRow]]:
    """The last ``count`` rows written: the tails of the files of the shards whose status was
    written last (a running shard's heartbeat, a finished one's end), after ``read_shards``."""
    run_dir = context.run_dir
    shards = heapq.nlargest(
        count,
        range(run_dir.num_shards),
        key=lambda k: context.statuses.written_at(context.statuses.paths[k]),
    )
    datasets = range(len(context.config.loading_params.datasets))
    candidates = [f for k in shards for d in datasets for f in row_files(context.config, d, k)]
    files = heapq.nlargest(count, candidates, key=lambda f: f.mtime)
    found: list[tuple[float, int, RowFile, FoundRow]] = []
    for file in files:
        try:
            rows = tail(file, count)
        except (OSError, ValueError):
            continue
        found += [(file.mtime, row.offset, file, row) for row in rows]
    found.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return [(file, row) for _, _, file, row in found[:count]]
