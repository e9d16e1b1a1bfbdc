"""Datasets whose ``path`` is an object-storage URL (``s3://``, ``gs://``, ``hf://``): JSONL,
CSV/TSV and Parquet, streamed through the dataset's ``ObjectStore`` by the same readers as
local files (they read ranges of the object: never the whole dataset in memory)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from mmirage.core.loader.base import DataError, RowReader
from mmirage.core.loader.delimited import DelimitedReader
from mmirage.core.loader.jsonl import JsonlReader
from mmirage.core.loader.parquet import ParquetReader, read_footers
from mmirage.storage import is_url, join
from mmirage.storage.store import ObjectStore

if TYPE_CHECKING:
    from mmirage.config.loading_params import DatasetConfig

Where = Callable[[int, "str | None", str], str]
"""Names a dataset's path in a sentence: ``dataset 0 (loading_params.datasets[0].path = ...)``."""


def open_remote(index: int, config: DatasetConfig, where: Where) -> dict[str | None, RowReader]:
    """A reader per split of a dataset on object storage; ``DataError`` (one sentence) when
    its type cannot be read from there or an object is missing."""
    opener = _OPENERS.get(config.type)
    paths = config.path if isinstance(config.path, dict) else {None: config.path}
    if opener is None:
        raise DataError(
            f"{where(index, None, str(config.path))}: type {config.type} is not read from object "
            "storage; use type JSONL, CSV, TSV or parquet there, or copy the dataset locally"
        )
    readers: dict[str | None, RowReader] = {}
    for split, path in paths.items():
        here = where(index, split, path)
        if not is_url(path):
            raise DataError(
                f"{here}: is a local path beside object-storage URLs; give every split a URL, "
                "or every split a local path"
            )
        field = f"loading_params.datasets[{index}].path"
        store = ObjectStore(path, config.storage_options, field)
        readers[split] = opener(here, path, split, store, config.type)
    return readers


def _need_object(here: str, path: str, store: ObjectStore) -> None:
    if not store.exists(path):
        raise DataError(f"{here}: no such object; fix the URL in the config or upload the data")


def _file_reader(
    here: str, path: str, split: str | None, store: ObjectStore, kind: str
) -> RowReader:
    _need_object(here, path, store)
    if store.isdir(path):
        raise DataError(f"{here}: is a folder, expected one {kind} object")
    if kind == "JSONL":
        return JsonlReader(path, split, opener=store.open)
    return DelimitedReader(path, split, kind=kind, opener=store.open)


def _parquet_reader(
    here: str, path: str, split: str | None, store: ObjectStore, kind: str
) -> RowReader:
    _need_object(here, path, store)
    files = store.glob(join(path, "*.parquet")) if store.isdir(path) else [path]
    if not files:
        raise DataError(
            f"{here}: the folder holds no *.parquet object; point path at a Parquet object or "
            "a folder of them"
        )
    try:
        rows = read_footers(files, store.open)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(
            f"{here}: not a readable Parquet object ({exc}); check it or the dataset's type"
        ) from None
    return ParquetReader(files, rows, opener=store.open)


_OPENERS: dict[str, Callable[[str, str, str | None, ObjectStore, str], RowReader]] = {
    "JSONL": _file_reader,
    "CSV": _file_reader,
    "TSV": _file_reader,
    "parquet": _parquet_reader,
}

__all__ = ["open_remote"]
