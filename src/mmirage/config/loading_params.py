"""``loading_params``: which datasets, how they are sharded, where state lives."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BeforeValidator

from mmirage.config.errors import FieldError
from mmirage.config.fields import NonNegativeInt, OptionalPathStr, PathStr, PositiveInt

_DATASET_TYPES = {"jsonl": "JSONL", "loadable": "loadable", "parquet": "parquet"}


def _dataset_type(value: object) -> object:
    # Any case ("jsonl", "JSONL"): a case mismatch is no reason to refuse a run; store the
    # canonical name.
    return _DATASET_TYPES.get(value.strip().lower(), value) if isinstance(value, str) else value


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


@dataclass
class DatasetConfig:
    """One input dataset. ``path`` is a file/directory, or ``{split: path}`` for JSONL splits."""

    path: str | dict[str, str]
    type: Annotated[Literal["JSONL", "loadable", "parquet"], BeforeValidator(_dataset_type)]
    output_dir: PathStr
    image_base_path: OptionalPathStr = None

    def __post_init__(self) -> None:
        if isinstance(self.path, str) and not self.path.strip():
            raise FieldError("path", "must be a non-empty path")
        if isinstance(self.path, dict) and not self.path:
            raise FieldError("path", "a split mapping needs at least one split: path entry")
        if isinstance(self.path, dict) and self.type != "JSONL":
            raise FieldError("path", "a {split: path} mapping is only supported for type JSONL")
        if not self.output_dir.strip():
            raise FieldError("output_dir", "must be a non-empty directory path")


@dataclass
class LoadingParams:
    """``state_dir`` defaults per config file (see ``reader.default_state_dir``); ``shard_id``
    ``None`` means "the shard the CLI or executor chose" — a literal number pins it.
    ``output_format`` defaults to HF directories, what existing readers of the outputs expect."""

    datasets: list[DatasetConfig] = field(default_factory=list)
    state_dir: OptionalPathStr = None
    num_shards: PositiveInt = 1
    shard_id: NonNegativeInt | None = None
    batch_size: PositiveInt = 1
    output_dir: str = ""  # legacy, unused: each dataset has its own output_dir
    # How each published shard is written (the part files stay JSONL): "hf", the original's
    # save_to_disk directory, loadable with datasets.load_from_disk; or one JSONL/Parquet file.
    output_format: Annotated[Literal["hf", "jsonl", "parquet"], BeforeValidator(_lower)] = "hf"
    # A malformed input row (bad JSON line, not an object): "skip" publishes it as a failed
    # row naming file and line, and goes on; "fail" stops the shard at the first one.
    on_bad_row: Annotated[Literal["skip", "fail"], BeforeValidator(_lower)] = "skip"

    def __post_init__(self) -> None:
        if not self.datasets:
            raise FieldError("datasets", "at least one dataset is required")
        seen: dict[str, int] = {}
        for index, dataset in enumerate(self.datasets):
            # Shards are published as <output_dir>/shard-k-of-n: two datasets sharing a folder
            # would overwrite each other's results.
            key = os.path.normpath(os.path.expanduser(dataset.output_dir))
            if key in seen:
                raise FieldError(
                    f"datasets[{index}].output_dir",
                    f"is also the output_dir of datasets[{seen[key]}]; give each dataset its own",
                )
            seen[key] = index
        if self.shard_id is not None and not 0 <= self.shard_id < self.num_shards:
            raise FieldError(
                "shard_id",
                f"must be between 0 and num_shards-1 ({self.num_shards - 1}), got {self.shard_id}",
            )
