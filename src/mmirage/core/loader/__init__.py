"""Streaming dataset readers: JSONL, Parquet and HF ``load_from_disk`` ("loadable") directories.

``open_dataset(config, index)`` checks the paths and returns a ``DatasetSource`` whose rows carry a
stable ``row_id``; ``shard_dataset``/``plan_shard`` cut it into the original's contiguous shards.
Heavy libraries (``datasets``, ``pyarrow``) are imported only when such a dataset is opened.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
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
from mmirage.core.loader.jsonl import JsonlReader
from mmirage.core.loader.sharding import (
    DatasetShard,
    ShardRange,
    plan_shard,
    shard_dataset,
    shard_range,
)

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
    if config.type == "JSONL":
        paths = config.path if isinstance(config.path, dict) else {None: config.path}
        readers: dict[str | None, RowReader] = {}
        for split, path in paths.items():
            _need_file(index, split, path, "a JSONL file")
            readers[split] = JsonlReader(path, split)
        return DatasetSource(index, config, readers)
    assert isinstance(config.path, str)  # the config allows a split mapping only for JSONL
    if config.type == "parquet":
        return DatasetSource(index, config, {None: _open_parquet(index, config.path)})
    return DatasetSource(index, config, dict(_open_loadable(index, config.path)))


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


def _open_parquet(index: int, path: str) -> RowReader:
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
