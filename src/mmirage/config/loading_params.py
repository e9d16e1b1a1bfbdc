"""``loading_params``: which datasets, how they are sharded, where state lives."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BeforeValidator

from llm_kit.keys import is_variable_name
from mmirage.config.errors import FieldError
from mmirage.config.fields import NonNegativeInt, OptionalPathStr, PathStr, PositiveInt
from mmirage.storage import is_url

# Accepted spellings (any case) → the stored name. ``hf`` is the name of the output format
# that ``loadable`` reads back.
_DATASET_TYPES = {
    "jsonl": "JSONL",
    "csv": "CSV",
    "tsv": "TSV",
    "parquet": "parquet",
    "loadable": "loadable",
    "hf": "loadable",
    "hub": "hub",
    "hf_hub": "hub",
}
# Options of ``load_dataset`` that only type hub takes.
HUB_OPTIONS = ("name", "split", "revision", "streaming")


def _dataset_type(value: object) -> object:
    # Any case ("jsonl", "JSONL"): a case mismatch is no reason to refuse a run; store the
    # canonical name.
    return _DATASET_TYPES.get(value.strip().lower(), value) if isinstance(value, str) else value


def _lower(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


@dataclass
class DatasetConfig:
    """One entry of ``loading_params.datasets``: an input dataset and where its results go."""

    path: str | dict[str, str]
    """The input: a file or directory, for `JSONL`, `CSV` and `TSV` a `{split: path}` mapping
    too, for `hub` a Hub dataset id (`org/name`) or a dataset repository folder. For JSONL,
    CSV, TSV and parquet, an object-storage URL (`s3://`, `gs://`, `hf://`) too."""
    type: Annotated[
        Literal["JSONL", "CSV", "TSV", "parquet", "loadable", "hub"],
        BeforeValidator(_dataset_type),
    ]
    """The input's format (any case): `JSONL` (one JSON object per line), `CSV` / `TSV` (a
    header row, then one row per record; every value is read as text), `parquet` (a file or a
    directory of `.parquet` files), `loadable` or `hf` (a directory written by the `datasets`
    library's `save_to_disk`), or `hub` (a dataset read by `datasets.load_dataset`: from the
    Hub, its local cache, or a folder). `loadable`, `hf` and `hub` need the `hf` extra."""
    output_dir: PathStr
    """Where this dataset's shards are published (`<output_dir>/shard-<k>-of-<n>`) and merged
    (`<output_dir>/merged`); each dataset needs its own. A folder, or an object-storage URL
    (`s3://`, `gs://`, `hf://`; with output_format jsonl or parquet)."""
    image_base_path: OptionalPathStr = None
    """The folder the rows' image paths are read from: a relative path is resolved against it
    and must stay inside it (see `processing_params.allow_absolute_image_paths`). Unset: the
    working directory."""
    name: str | None = None
    """Type `hub` only: the dataset's configuration (subset), `load_dataset`'s `name`."""
    split: str | None = None
    """Type `hub` only: read this split alone. Unset: every split, each sharded on its own."""
    revision: str | None = None
    """Type `hub` only: a branch, tag or commit of the Hub repository. Unset: `main`."""
    streaming: bool = False
    """Type `hub` only: read rows from the data files as they come instead of preparing the
    whole dataset in the `datasets` cache first (a stream whose card gives no row count is read
    once to count its rows)."""
    storage_options: dict[str, str] | None = None
    """For a `path` or `output_dir` on object storage (`s3://`, `gs://`, `hf://`): options of
    its fsspec filesystem (`key`, `secret`, `endpoint_url`...), each given as the NAME of the
    environment variable that holds it, never the value. Unset: the filesystem reads its own
    variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`...)."""

    def __post_init__(self) -> None:
        if isinstance(self.path, str) and not self.path.strip():
            raise FieldError("path", "must be a non-empty path")
        if isinstance(self.path, dict) and not self.path:
            raise FieldError("path", "a split mapping needs at least one split: path entry")
        if isinstance(self.path, dict) and self.type not in ("JSONL", "CSV", "TSV"):
            raise FieldError(
                "path", "a {split: path} mapping is only supported for types JSONL, CSV and TSV"
            )
        for option in HUB_OPTIONS:
            if self.type != "hub" and getattr(self, option) not in (None, False):
                raise FieldError(option, f"is an option of type hub, not {self.type}; remove it")
        if not self.output_dir.strip():
            raise FieldError("output_dir", "must be a non-empty directory path")
        for option, variable in (self.storage_options or {}).items():
            if not is_variable_name(variable):  # a storage_options value names a variable
                raise FieldError(
                    f"storage_options.{option}",
                    "must be the name of an environment variable holding the value (a secret "
                    "never goes in a config file); export the value and give its name",
                )


@dataclass
class LoadingParams:
    """``loading_params``: which datasets are read, how they are cut into shards, and where the
    pipeline keeps its state."""

    datasets: list[DatasetConfig] = field(default_factory=list)
    """The input datasets (at least one); every shard takes its part of each."""
    state_dir: OptionalPathStr = None
    """Where the pipeline keeps shard statuses, retry counts, checkpoints and (by default) batch
    receipts. Unset: a folder of this config's own,
    `$XDG_CACHE_HOME/mmirage/state/<config name>-<hash of its path>` (`~/.cache` without
    `XDG_CACHE_HOME`)."""
    num_shards: PositiveInt = 1
    """How many contiguous shards each dataset is cut into: the unit of parallelism, retry and
    publication."""
    shard_id: NonNegativeInt | None = None
    """Pin `mmirage run` to this shard (0 to `num_shards - 1`). Unset: every shard, or the one
    `--shard-id` names."""
    batch_size: PositiveInt = 1
    """Rows handed to the processors at a time (more when a processor asks for more to stay
    busy). Finished rows are checkpointed once a second, whatever the group size."""
    output_dir: str = ""
    """Unused, accepted so that the original MMIRAGE's configs load: each dataset has its own
    `output_dir`."""
    output_format: Annotated[Literal["hf", "jsonl", "parquet"], BeforeValidator(_lower)] = "hf"
    """How each published shard is written: `hf`, a `save_to_disk` directory readable with
    `datasets.load_from_disk`; `jsonl` or `parquet`, one file."""
    on_bad_row: Annotated[Literal["skip", "fail"], BeforeValidator(_lower)] = "skip"
    """What a malformed input row (a bad JSON line, a line that is not an object) does: `skip`
    publishes it as a failed row naming file and line, and goes on; `fail` stops the shard at the
    first one."""

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
        remote = [i for i, d in enumerate(self.datasets) if is_url(d.output_dir)]
        if remote and self.output_format == "hf":
            raise FieldError(
                "output_format",
                f"is hf, but datasets[{remote[0]}].output_dir is on object storage, where each "
                "shard is published as one object; set output_format: jsonl or parquet",
            )
        if self.shard_id is not None and not 0 <= self.shard_id < self.num_shards:
            raise FieldError(
                "shard_id",
                f"must be between 0 and num_shards-1 ({self.num_shards - 1}), got {self.shard_id}",
            )
