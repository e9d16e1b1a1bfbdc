"""Columns built from their buffers are what ``pyarrow.array`` makes of the same values, type and
bytes, and a shard of such columns is written without importing pandas."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

from mmirage.core.writer.arrow_columns import plain_array, plain_type

BUILT: dict[str, list[Any]] = {
    "strings": ["a", "é ✓ 漢字", "", "x" * 300],
    "strings_nulls": [None, "a", None, "", "b", None, None, None, "c"],
    "ints": [0, -1, 2**63 - 1, -(2**63), 7],
    "ints_nulls": [None, 3, None, None, None, None, None, None, None, 4],
    "floats": [0.5, -1e300, math.inf, math.nan, 0.0],
    "floats_nulls": [1.5, None, 2.5],
    "bools": [True, False, True, True, False, False, False, False, True, False],
    "bools_nulls": [None, True, False, None, True],
    "nulls": [None, None, None],
    "one_row": ["only"],
    "structs": [{"a": "x", "b": 1}, None, {"a": None}, {"b": 2}, {"c": {"d": 1.5}}],
    "nested_null_structs": [{"u": None}, None, {"u": {"s": "t", "b": True, "n": None}}],
    "usage": [{"input_tokens": i, "output_tokens": 2 * i} for i in range(1000)],
    "empty_structs": [{}, None, {}],
}
LEFT_TO_PYARROW: dict[str, list[Any]] = {
    "int_and_float": [1, 2.5],
    "bool_and_int": [True, 1],
    "beyond_int64": [2**63],
    "lists": [[1], [2]],
    "struct_of_lists": [{"a": [1]}],
    "int_keys": [{1: 2}],
    "bytes": [b"x"],
    "str_subclass": [type("S", (str,), {})("x")],
}


def _bytes(column: Any) -> bytes:
    batch = pa.RecordBatch.from_arrays([column], names=["c"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("case", sorted(BUILT))
def test_built_column_is_what_pyarrow_makes(case: str) -> None:
    values = BUILT[case]
    reference = pa.array(values)
    assert plain_type(values) == reference.type
    built = plain_array(values, reference.type)
    assert built is not None
    assert built.type == reference.type and built.null_count == reference.null_count
    assert _bytes(built) == _bytes(reference)
    built.validate(full=True)


@pytest.mark.parametrize("case", sorted(LEFT_TO_PYARROW))
def test_other_values_are_left_to_pyarrow(case: str) -> None:
    values = LEFT_TO_PYARROW[case]
    assert plain_type(values) is None
    for arrow_type in (pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.null()):
        assert plain_array(values, arrow_type) is None


def test_values_of_another_type_are_left_to_pyarrow() -> None:
    assert plain_array(["1"], pa.int64()) is None
    assert plain_array([1], pa.string()) is None
    assert plain_array([1], pa.float64()) is None  # pyarrow converts it; it decides
    assert plain_array(["a"], pa.list_(pa.string())) is None
    assert plain_array([{"a": 1, "z": 2}], pa.struct([("a", pa.int64())])) is None
    assert plain_array(["\ud800"], pa.string()) is None  # pyarrow raises its own error


def test_hf_shard_of_plain_columns_does_not_import_pandas(tmp_path: Any) -> None:
    probe = (
        "import sys\n"
        "from pathlib import Path\n"
        "from mmirage.core.writer import formats\n"
        "rows = [{'id': i, 't': f'r{i}', 'f': i / 3, 'b': i % 2 == 0, 'n': None,"
        " 'u': {'in': i, 'out': None if i % 3 else 'x'}}"
        " for i in range(2500)]\n"
        "def batches():\n"
        "    for start in range(0, len(rows), 1000):\n"
        "        yield rows[start : start + 1000]\n"
        f"formats.write_dataset(batches, Path({str(tmp_path / 'out')!r}), 'hf')\n"
        "print('pandas' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
