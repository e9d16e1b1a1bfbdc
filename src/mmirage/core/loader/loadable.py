"""HF ``save_to_disk`` directories (``Dataset`` or ``DatasetDict``), via ``load_from_disk``.

The Arrow files are memory-mapped; rows are materialised one slice at a time, so memory is bound
by the slice, not the dataset. Row ids are positions in the ``Dataset`` (per split for a dict).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mmirage.core.loader.base import BadRowSink, OnBadRow, Row, RowReader, check_bounds
from mmirage.errors import require_extra

DEFAULT_BATCH_SIZE = 1000


class LoadableReader(RowReader):
    """One memory-mapped HF ``Dataset`` (a saved dataset, or one split of a saved dict)."""

    def __init__(
        self, dataset: Any, split: str | None = None, *, batch_size: int = DEFAULT_BATCH_SIZE
    ) -> None:
        super().__init__(split)
        # A format saved with the dataset (torch, numpy...) would change the row values: use Python.
        self._dataset = dataset.with_format(None)
        self._batch_size = batch_size

    @property
    def num_rows(self) -> int:
        return int(self._dataset.num_rows)

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        on_bad_row: OnBadRow = "fail",  # Arrow rows are typed: there is no malformed row
        bad_rows: BadRowSink | None = None,
    ) -> Iterator[Row]:
        start, end = check_bounds(start, stop, self.num_rows)
        assert end is not None
        for lo in range(start, end, self._batch_size):
            hi = min(lo + self._batch_size, end)
            columns: dict[str, list[Any]] = self._dataset[lo:hi]  # decoded by the features
            names = list(columns)
            values = zip(*columns.values(), strict=True) if names else ((),) * (hi - lo)
            for i, row in enumerate(values):
                yield Row(lo + i, dict(zip(names, row, strict=True)), self.split)


def load_saved(path: str) -> dict[str | None, LoadableReader]:
    """Readers for a saved dataset: ``{None: reader}`` or one per split of a ``DatasetDict``.

    Raises ``FileNotFoundError`` when ``path`` is not a ``save_to_disk`` directory.
    """
    datasets = require_extra("datasets", "hf", f"reading the saved dataset {path}")
    saved = datasets.load_from_disk(path, keep_in_memory=False)
    if isinstance(saved, datasets.DatasetDict):
        return {name: LoadableReader(split_ds, name) for name, split_ds in saved.items()}
    return {None: LoadableReader(saved)}
