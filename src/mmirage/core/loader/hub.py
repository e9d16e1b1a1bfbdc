"""Datasets by name (``org/name`` on the Hugging Face Hub, or a dataset repository folder), read
through ``datasets.load_dataset``.

Without streaming, ``load_dataset`` prepares Arrow files in its cache once, and rows are read from
them memory-mapped, as for a saved dataset. With ``streaming: true`` rows are read from the data
files as they come. Either way a row id is the row's position in its split, the same on every
read (nothing is shuffled), so shards and resume work as for a file. Offline
(``HF_HUB_OFFLINE=1``), ``load_dataset`` reads a Hub dataset from what an earlier load left in
the cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from mmirage.core.loader.base import (
    BadRowSink,
    DataError,
    OnBadRow,
    Row,
    RowReader,
    check_bounds,
)
from mmirage.core.loader.loadable import LoadableReader
from mmirage.errors import MmirageError, require_extra

if TYPE_CHECKING:
    from mmirage.config.loading_params import DatasetConfig

COUNT_BATCH = 1000


class StreamReader(RowReader):
    """One split of a streamed (``IterableDataset``) dataset."""

    def __init__(self, stream: Any, split: str | None, where: str) -> None:
        super().__init__(split)
        self._stream, self._where = stream, where
        self._num_rows: int | None = _rows_on_card(stream)
        self._counted = self._num_rows is None

    @property
    def num_rows(self) -> int:
        if self._num_rows is None:  # the card does not say: one pass over the stream
            batches = self._stream.iter(batch_size=COUNT_BATCH)
            self._num_rows = sum(len(next(iter(batch.values()), ())) for batch in batches)
        return self._num_rows

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        on_bad_row: OnBadRow = "fail",  # rows come typed by the dataset's features
        bad_rows: BadRowSink | None = None,
    ) -> Iterator[Row]:
        start, end = check_bounds(start, stop, self.num_rows)
        assert end is not None
        examples = iter(self._stream)
        for row_id, example in enumerate(itertools.islice(examples, start, end), start):
            yield Row(row_id, dict(example), self.split)
        if end == self.num_rows and not self._counted and next(examples, None) is not None:
            # Shards were cut by the card's count: a row past it would belong to no shard.
            raise DataError(
                f"{self._where}: the stream has more rows than the {end} its dataset card "
                "states; fix the card's num_examples or set streaming: false"
            )


def _rows_on_card(stream: Any) -> int | None:
    splits = getattr(stream.info, "splits", None)
    split = getattr(stream, "split", None)
    if not splits or split is None or str(split) not in splits:
        return None
    count = splits[str(split)].num_examples
    return int(count) if count else None


def load_hub(config: DatasetConfig, where: str) -> dict[str | None, RowReader]:
    """A reader per split (``{None: reader}`` when ``config.split`` picks one).

    Raises ``DataError`` (naming ``where``) when ``load_dataset`` cannot load the dataset."""
    assert isinstance(config.path, str)
    datasets = require_extra("datasets", "hf", f"reading {config.path!r} (type hub)")
    from llm_kit.hf_datasets import quiet_datasets  # pydantic et al.: not at mmirage's start

    try:
        with quiet_datasets(datasets):
            loaded = datasets.load_dataset(
                config.path,
                name=config.name,
                split=config.split,
                revision=config.revision,
                streaming=config.streaming,
            )
    except MmirageError:
        raise
    except Exception as exc:  # its failures come from many libraries: hub, fsspec, builders
        summary = " ".join(str(exc).split()) or type(exc).__name__
        raise DataError(
            f"{where}: datasets.load_dataset could not load it ({summary}); check path, name, "
            "split and revision (offline, it reads only what an earlier load left in the cache)"
        ) from exc
    if isinstance(loaded, datasets.DatasetDict | datasets.IterableDatasetDict):
        parts: dict[str | None, Any] = dict(loaded.items())
    else:
        parts = {None: loaded}
    if config.streaming:
        return {split: StreamReader(part, split, where) for split, part in parts.items()}
    return {split: LoadableReader(part, split) for split, part in parts.items()}
