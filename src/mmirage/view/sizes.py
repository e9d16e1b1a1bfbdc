"""How many source rows each shard has (for "pending"), found once in the background: opening
the sources can take a while (a JSONL file is indexed), and the page must not wait for it."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

logger = logging.getLogger(__name__)


class ShardSizes:
    def __init__(self, config: MMirageConfig) -> None:
        self._config = config
        self.sizes: dict[int, int] = {}  # empty until known (then every shard)

    def start(self) -> None:
        threading.Thread(target=self._find, name="view-sizes", daemon=True).start()

    def _find(self) -> None:
        from mmirage.core.loader import open_dataset, shard_range

        lp = self._config.loading_params
        sizes = dict.fromkeys(range(lp.num_shards), 0)
        try:
            for index, dataset in enumerate(lp.datasets):
                source = open_dataset(dataset, index)
                for split in source.splits:
                    rows = source.reader(split).num_rows
                    for k in sizes:
                        start, stop = shard_range(rows, lp.num_shards, k)
                        sizes[k] += stop - start
        except Exception as exc:  # an unreadable source leaves pending unknown
            logger.info("the sources' sizes are unknown (%s): pending rows are not shown", exc)
            return
        self.sizes = sizes
