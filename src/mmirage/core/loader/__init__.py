"""Streaming dataset readers: JSONL, CSV/TSV, Parquet, HF ``load_from_disk`` ("loadable")
directories and ``load_dataset`` datasets ("hub").

``open_dataset(config, index)`` checks the paths and returns a ``DatasetSource`` whose rows carry a
stable ``row_id``; ``shard_dataset``/``plan_shard`` cut it into the original's contiguous shards.
Heavy libraries (``datasets``, ``pyarrow``) are imported only when such a dataset is opened.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mmirage.core.loader.base import (
    BadRow,
    BadRowSink,
    DataError,
    DatasetSource,
    OnBadRow,
    Row,
    RowReader,
)
from mmirage.core.loader.delimited import DelimitedReader
from mmirage.core.loader.jsonl import JsonlReader
from mmirage.core.loader.sharding import (
    DatasetShard,
    ShardRange,
    plan_shard,
    shard_dataset,
    shard_range,
)
from mmirage.storage import is_url

if TYPE_CHECKING:
    from mmirage.config.loading_params import DatasetConfig

__all__ = [
    "BadRow",
    "BadRowSink",
    "DataError",
    "DatasetShard",
    "DatasetSource",
    "OnBadRow",
    "Row",
    "RowReader",
    "ShardRange",
    "open_dataset",
    "open_datasets",
    "plan_shard",
    "shard_dataset",
    "shard_range",
]


def open_datasets(
    configs: Sequence[DatasetConfig], config_path: str | None = None
) -> list[DatasetSource]:
    """Open every dataset or fail: a dataset that cannot be read is an error, never skipped
    (skipping it would shift later datasets into the wrong output_dir). ``config_path``, when
    given, starts the error's sentence."""
    try:
        return [open_dataset(config, index) for index, config in enumerate(configs)]
    except DataError as exc:
        if config_path:
            raise DataError(f"{config_path}: {exc}") from None
        raise


def open_dataset(config: DatasetConfig, index: int = 0) -> DatasetSource:
    """Check ``config.path`` and return a reader per split. Raises ``DataError`` (one sentence
    naming the dataset index, the path and what to do) when the path cannot be used."""
    if _on_object_storage(config):
        from mmirage.core.loader.remote import open_remote  # fsspec only for such a dataset

        return DatasetSource(index, config, open_remote(index, config, _where))
    return DatasetSource(index, config, _OPENERS[config.type](index, config))


def _on_object_storage(config: DatasetConfig) -> bool:
    # A hub dataset's path is load_dataset's to read, whatever it looks like.
    paths = config.path.values() if isinstance(config.path, dict) else [config.path]
    return config.type != "hub" and any(map(is_url, paths))


def _open_files(index: int, config: DatasetConfig) -> dict[str | None, RowReader]:
    """A JSONL, CSV or TSV file, or a ``{split: file}`` mapping of them."""
    paths = config.path if isinstance(config.path, dict) else {None: config.path}
    readers: dict[str | None, RowReader] = {}
    for split, path in paths.items():
        _need_file(index, split, path, f"a {config.type} file")
        readers[split] = _FILE_READERS[config.type](path, split)
    return readers


_FILE_READERS: dict[str, Callable[[str, str | None], RowReader]] = {
    "JSONL": JsonlReader,
    "CSV": functools.partial(DelimitedReader, kind="CSV"),
    "TSV": functools.partial(DelimitedReader, kind="TSV"),
}


def _open_parquet(index: int, config: DatasetConfig) -> dict[str | None, RowReader]:
    assert isinstance(config.path, str)  # the config allows a split mapping only for files
    return {None: _parquet_reader(index, config.path)}


def _open_hub(index: int, config: DatasetConfig) -> dict[str | None, RowReader]:
    from mmirage.core.loader.hub import load_hub

    assert isinstance(config.path, str)
    return load_hub(config, _where(index, None, config.path))


def _open_saved(index: int, config: DatasetConfig) -> dict[str | None, RowReader]:
    assert isinstance(config.path, str)
    return dict(_open_loadable(index, config.path))


_OPENERS: dict[str, Callable[[int, DatasetConfig], dict[str | None, RowReader]]] = {
    "JSONL": _open_files,
    "CSV": _open_files,
    "TSV": _open_files,
    "parquet": _open_parquet,
    "loadable": _open_saved,
    "hub": _open_hub,
}


def _where(index: int, split: str | None, path: str) -> str:
    field = f"loading_params.datasets[{index}].path" + (f".{split}" if split is not None else "")
    return f"dataset {index} ({field} = {path!r})"


def _need_exists(index: int, split: str | None, path: str) -> None:
    if not os.path.exists(path):
        raise DataError(
            f"{_where(index, split, path)}: no such file or directory "
            f"(resolved to {os.path.abspath(path)}); fix the path in the config or create it"
        )


def _need_file(index: int, split: str | None, path: str, what: str) -> None:
    _need_exists(index, split, path)
    if os.path.isdir(path):
        raise DataError(f"{_where(index, split, path)}: is a directory, expected {what}")
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise DataError(
            f"{_where(index, split, path)}: cannot be read ({exc.strerror}); check its permissions"
        ) from exc


def _parquet_reader(index: int, path: str) -> RowReader:
    from mmirage.core.loader.parquet import ParquetReader, read_footers

    _need_exists(index, None, path)
    if os.path.isdir(path):
        files = sorted(
            os.path.join(path, name) for name in os.listdir(path) if name.endswith(".parquet")
        )
        if not files:
            raise DataError(
                f"{_where(index, None, path)}: the directory holds no *.parquet file; "
                "point path at a Parquet file or a directory of them"
            )
    else:
        _need_file(index, None, path, "a Parquet file")
        files = [path]
    try:
        file_rows = read_footers(files)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise DataError(
            f"{_where(index, None, path)}: not a readable Parquet file ({exc}); "
            "check the file or the dataset's type"
        ) from exc
    return ParquetReader(files, file_rows)


def _open_loadable(index: int, path: str) -> dict[str | None, RowReader]:
    from mmirage.core.loader.loadable import load_saved

    _need_exists(index, None, path)
    if not os.path.isdir(path):
        raise DataError(
            f"{_where(index, None, path)}: is a file, but type loadable needs a directory written "
            "by Dataset.save_to_disk; use type JSONL or parquet for a data file"
        )
    try:
        return dict(load_saved(path))
    except FileNotFoundError as exc:
        raise DataError(
            f"{_where(index, None, path)}: not a dataset saved with save_to_disk (no "
            "dataset_info.json or dataset_dict.json); point path at such a directory"
        ) from exc
