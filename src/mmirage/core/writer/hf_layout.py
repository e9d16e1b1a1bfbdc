"""HF ``save_to_disk`` directories written with pyarrow alone, byte for byte what ``datasets``
writes, without importing ``datasets`` (about 0.6 s of start-up, more than the conversion of a
shard of thousands of rows costs).

``datasets`` (4 and later) saves a dataset of one shard as three files:
``data-00000-of-00001.arrow`` (an Arrow stream whose schema carries the features as
``huggingface`` metadata, one record batch per 1000 rows), ``dataset_info.json`` and
``state.json``. This module writes that layout for the column types rows hold (null, bool,
numbers, strings, bytes, dates, times, decimals, lists and structs of them);
``HfLayout.for_schema`` answers ``None`` for anything else, and ``fits_one_file`` says when
``datasets`` itself must write the directory (a dataset it would split into several files or
write in smaller batches, batches of other sizes, an older ``datasets``). The tests compare
the bytes with ``datasets``' own ``save_to_disk``. Without ``datasets`` installed (it is the
``hf`` extra) this layout is the only writer, for any size (a column of a type it cannot
describe is written as JSON text), and ``iter_saved`` reads such directories back with pyarrow
alone.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

DATA_FILE = "data-00000-of-00001.arrow"
WRITER_BATCH_ROWS = 1000  # datasets' DEFAULT_MAX_BATCH_SIZE
# datasets' ARROW_RECORD_BATCH_SIZE_FOR_BINARY_DATASETS: a binary value anywhere, smaller batches.
_BINARY_WRITER_BATCH_ROWS = 100
# datasets' MAX_SHARD_SIZE (500MB: more makes several data files) and MAX_ROW_GROUP_SIZE
# (100MB: bigger batches are split smaller), with a margin: near them, datasets decides.
_ONE_FILE_BYTES = 450 * 10**6
_BATCH_BYTES = 90 * 10**6

# The ``datasets`` dtype of each Arrow scalar type, as its ``_arrow_to_datasets_dtype`` names
# it: rows read from Parquet bring dates, timestamps, bytes and decimals along.
_VALUE_DTYPES = {
    "null": "null",
    "bool": "bool",
    **{name: name for name in ("int8", "int16", "int32", "int64")},
    **{name: name for name in ("uint8", "uint16", "uint32", "uint64")},
    "halffloat": "float16",
    "float": "float32",
    "double": "float64",
    "date32[day]": "date32",
    "date64[ms]": "date64",
    **{name: name for name in ("binary", "large_binary", "string", "large_string")},
}
# Types with parameters, which ``datasets`` names as Arrow does (``timestamp[us, tz=UTC]``,
# ``decimal128(10, 2)``, ``duration[us]``, ``fixed_size_binary[16]``).
_NAMED_AS_ARROW = (
    "is_timestamp",
    "is_time32",
    "is_time64",
    "is_duration",
    "is_decimal128",
    "is_decimal256",
    "is_fixed_size_binary",
)


_VERSION = re.compile(r"^__version__ = [\"'](\d+)\.", re.MULTILINE)


def _feature(arrow_type: Any) -> Any | None:
    """The ``datasets`` feature of one column type, as ``Features.to_dict`` writes it;
    ``None`` when only ``datasets`` knows how to write that type."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        fields = {field.name: _feature(field.type) for field in arrow_type}
        return None if None in fields.values() else fields
    if pa.types.is_list(arrow_type):
        inner = _feature(arrow_type.value_type)
        return None if inner is None else {"feature": inner, "_type": "List"}
    dtype = _VALUE_DTYPES.get(str(arrow_type))
    if dtype is None and any(getattr(pa.types, test)(arrow_type) for test in _NAMED_AS_ARROW):
        dtype = str(arrow_type)
    return None if dtype is None else {"dtype": dtype, "_type": "Value"}


def unmapped_columns(schema: Any) -> list[str]:
    """The columns of ``schema`` (a ``pyarrow.Schema``) whose type this layout cannot describe
    (an Arrow interval, say): without ``datasets``, they are written as JSON text."""
    return [field.name for field in schema if _feature(field.type) is None]


def datasets_installed() -> bool:
    """Whether the ``datasets`` package (the ``hf`` extra) can be imported, without importing it."""
    return find_spec("datasets") is not None


def _datasets_writes_lists_as_list() -> bool:
    """``datasets`` 4 and later name lists ``List`` (older ones ``Sequence``). The version is
    read from the package's ``__init__.py``: importlib.metadata alone costs 30 ms. Without
    ``datasets``, whoever loads the directory installs one later: a current one, 4 or later."""
    spec = find_spec("datasets")
    if spec is None:
        return True
    if spec.origin is None:
        return False
    try:
        found = _VERSION.search(Path(spec.origin).read_text(encoding="utf-8"))
    except OSError:
        return False
    return found is not None and int(found.group(1)) >= 4


@dataclass
class HfLayout:
    """The features of one schema and the Arrow schema that carries them."""

    features: dict[str, Any]
    arrow: Any  # pyarrow.Schema, with the huggingface metadata
    writer_rows: int = WRITER_BATCH_ROWS  # the rows of each record batch datasets writes

    @classmethod
    def for_schema(cls, schema: Any) -> HfLayout | None:
        """The layout for ``schema`` (a ``pyarrow.Schema``), or ``None`` when only
        ``datasets`` may write it."""
        features = {field.name: _feature(field.type) for field in schema}
        if None in features.values() or not _datasets_writes_lists_as_list():
            return None
        described = json.dumps({"info": {"features": features}})
        binary = '"dtype": "binary"' in described
        rows = _BINARY_WRITER_BATCH_ROWS if binary else WRITER_BATCH_ROWS
        return cls(features, schema.with_metadata({"huggingface": described}), rows)

    @staticmethod
    def fits_one_file(
        batch_rows: list[int], nbytes: int, writer_rows: int = WRITER_BATCH_ROWS
    ) -> bool:
        """Whether ``datasets`` would write these record batches (their row counts, their
        total size) as they are: one data file, batches of ``writer_rows`` rows, the last one
        shorter."""
        rows = sum(batch_rows)
        whole = all(n == writer_rows for n in batch_rows[:-1])
        last = not batch_rows or 0 < batch_rows[-1] <= writer_rows
        small = nbytes < _ONE_FILE_BYTES and nbytes * writer_rows <= _BATCH_BYTES * rows
        return whole and last and (small or rows == 0)

    def install(self, stream: Path, path: Path) -> None:
        """Make ``path`` (absent) the dataset whose Arrow stream ``stream`` holds (moved in)."""
        path.mkdir()
        os.replace(stream, path / DATA_FILE)
        state: dict[str, Any] = {
            "_data_files": [{"filename": DATA_FILE}],
            # datasets fingerprints a dataset loaded from a file by its temporary path: a value
            # new at every run, as this one.
            "_fingerprint": os.urandom(8).hex(),
            "_format_columns": None,
            "_format_kwargs": {},
            "_format_type": None,
            "_output_all_columns": False,
            "_split": None,
        }
        info = {"citation": "", "description": "", "features": self.features}
        info.update(homepage="", license="")
        with open(path / "state.json", "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2, sort_keys=True)
        with open(path / "dataset_info.json", "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2)


def iter_saved(path: Path, batch_rows: int) -> Iterator[list[dict[str, Any]]]:
    """The rows of a ``save_to_disk`` directory (a ``Dataset``, or a ``DatasetDict`` split by
    split), read with pyarrow alone: ``load_from_disk`` reads the same Arrow stream files,
    listed in ``state.json`` (``save_to_disk`` writes them with any index mapping applied)."""
    import pyarrow as pa

    splits_file = path / "dataset_dict.json"
    if splits_file.is_file():
        for split in json.loads(splits_file.read_text(encoding="utf-8"))["splits"]:
            yield from iter_saved(path / split, batch_rows)
        return
    state = json.loads((path / "state.json").read_text(encoding="utf-8"))
    for data_file in state["_data_files"]:
        with pa.memory_map(str(path / data_file["filename"])) as source:
            table = pa.ipc.open_stream(source).read_all()
            for record_batch in table.to_batches(max_chunksize=batch_rows):
                yield record_batch.to_pylist()
