"""HF ``save_to_disk`` directories written with pyarrow alone, byte for byte what ``datasets``
writes, without importing ``datasets`` (about 0.6 s of start-up, more than the conversion of a
shard of thousands of rows costs).

``datasets`` (4 and later) saves a dataset of one shard as three files:
``data-00000-of-00001.arrow`` (an Arrow stream whose schema carries the features as
``huggingface`` metadata, one record batch per 1000 rows), ``dataset_info.json`` and
``state.json``. This module writes that layout for the column types JSON rows produce (null,
bool, int64, double, string, lists and structs of them); ``HfLayout.for_schema`` answers
``None`` for anything else, and ``fits_one_file`` says when ``datasets`` itself must write the
directory (a dataset it would split into several files or write in smaller batches, batches of
other sizes, an older ``datasets``). The tests compare the bytes with ``datasets``' own
``save_to_disk``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_FILE = "data-00000-of-00001.arrow"
WRITER_BATCH_ROWS = 1000  # datasets' DEFAULT_MAX_BATCH_SIZE
# datasets' MAX_SHARD_SIZE (500MB: more makes several data files) and MAX_ROW_GROUP_SIZE
# (100MB: bigger batches are split smaller), with a margin: near them, datasets decides.
_ONE_FILE_BYTES = 450 * 10**6
_BATCH_BYTES = 90 * 10**6

_VALUE_DTYPES = {
    "null": "null",
    "bool": "bool",
    "int64": "int64",
    "double": "float64",
    "string": "string",
}


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
    return None if dtype is None else {"dtype": dtype, "_type": "Value"}


def _datasets_writes_lists_as_list() -> bool:
    """``datasets`` 4 and later name lists ``List`` (older ones ``Sequence``). The version is
    read from the package's ``__init__.py``: importlib.metadata alone costs 30 ms."""
    from importlib.util import find_spec

    spec = find_spec("datasets")
    if spec is None or spec.origin is None:
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

    @classmethod
    def for_schema(cls, schema: Any) -> HfLayout | None:
        """The layout for ``schema`` (a ``pyarrow.Schema``), or ``None`` when only
        ``datasets`` may write it."""
        features = {field.name: _feature(field.type) for field in schema}
        if None in features.values() or not _datasets_writes_lists_as_list():
            return None
        metadata = {"huggingface": json.dumps({"info": {"features": features}})}
        return cls(features, schema.with_metadata(metadata))

    @staticmethod
    def fits_one_file(batch_rows: list[int], nbytes: int) -> bool:
        """Whether ``datasets`` would write these record batches (their row counts, their
        total size) as they are: one data file, batches of 1000 rows, the last one shorter."""
        rows = sum(batch_rows)
        whole = all(n == WRITER_BATCH_ROWS for n in batch_rows[:-1])
        last = not batch_rows or 0 < batch_rows[-1] <= WRITER_BATCH_ROWS
        small = nbytes < _ONE_FILE_BYTES and nbytes * WRITER_BATCH_ROWS <= _BATCH_BYTES * rows
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
