"""Arrow arrays of plain JSON values, built from their buffers instead of ``pyarrow.array``.

``pyarrow.array`` asks pandas whether its input is a pandas object, and the first such question
imports pandas (about 0.3 s, more than writing a shard of thousands of rows). The columns LLM
rows mostly have are typed and built here without asking: strings, ints, floats, bools or nulls
(one Python type per column, besides ``None``) and structs of such columns (every row's
``__usage__``). They get the types ``pyarrow.array`` infers and the same arrays, buffer for
buffer. For any other column both functions answer ``None`` and the caller uses
``pyarrow.array``, which also raises the errors of values that do not fit their type.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from itertools import accumulate
from typing import Any

_INT64 = (-(2**63), 2**63 - 1)
_NONE = type(None)


class _Empty:
    """What pyarrow puts in a struct's fields where the struct itself is null: an empty value
    ("", 0, False, a struct of empty values), valid, not a null."""


_EMPTY = _Empty()


def plain_type(values: list[Any]) -> Any:
    """The type ``pyarrow.array(values)`` infers, for plain values; else ``None``."""
    import pyarrow as pa

    kinds = set(map(type, values))
    kinds.discard(_NONE)
    if not kinds:
        return pa.null()
    if len(kinds) > 1:
        return None
    kind = kinds.pop()
    if kind is dict:
        return _struct_type([v for v in values if v is not None])
    if kind is int and not _fit_int64(values):
        return None  # pyarrow picks uint64 or fails
    name = _TYPE_OF.get(kind)
    return None if name is None else getattr(pa, name)()


def plain_array(values: list[Any], arrow_type: Any) -> Any:
    """``pyarrow.array(values, type=arrow_type)`` for plain values of that type; else ``None``."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        return _struct_array(values, arrow_type)
    name = str(arrow_type)
    if name == "null":
        return pa.nulls(len(values)) if set(map(type, values)) <= {_NONE, _Empty} else None
    python_type = _PYTHON_TYPE.get(name)
    if python_type is None or not set(map(type, values)) <= {python_type, _NONE, _Empty}:
        return None
    if python_type is int and not _fit_int64(values):
        return None
    data = _BUILDERS[name](values)
    if data is None:
        return None
    nulls = values.count(None)
    return pa.Array.from_buffers(
        arrow_type, len(values), [_validity(values, nulls), *data], null_count=nulls
    )


def _struct_type(dicts: list[dict[Any, Any]]) -> Any:
    import pyarrow as pa

    names: dict[Any, None] = {}
    for d in dicts:
        names.update(dict.fromkeys(d))
    if not all(type(name) is str for name in names):
        return None
    fields = []
    for name in names:
        child = plain_type([d.get(name) for d in dicts])
        if child is None:
            return None
        fields.append((name, child))
    return pa.struct(fields)


def _struct_array(values: list[Any], arrow_type: Any) -> Any:
    import pyarrow as pa

    if not set(map(type, values)) <= {dict, _NONE, _Empty}:
        return None
    names = {field.name for field in arrow_type}
    if not all(names.issuperset(v) for v in values if type(v) is dict):
        return None
    children = []
    for field in arrow_type:
        child_values = [v.get(field.name) if type(v) is dict else _EMPTY for v in values]
        child = plain_array(child_values, field.type)
        if child is None:
            return None
        children.append(child)
    nulls = values.count(None)
    validity = _validity(values, nulls)
    return pa.Array.from_buffers(
        arrow_type, len(values), [validity], null_count=nulls, children=children
    )


def _fit_int64(values: list[Any]) -> bool:
    present = [v for v in values if type(v) is int]
    return not present or (_INT64[0] <= min(present) and max(present) <= _INT64[1])


def _validity(values: list[Any], nulls: int) -> Any:
    return _bitmap([v is not None for v in values]) if nulls else None


def _bitmap(bits: list[bool]) -> Any:
    """Arrow's bit order: bit i of the buffer is ``bits[i]``, least significant bit first."""
    import pyarrow as pa

    digits = "".join("1" if bit else "0" for bit in reversed(bits))
    return pa.py_buffer(int(digits or "0", 2).to_bytes((len(bits) + 7) // 8, "little"))


def _strings(values: list[Any]) -> list[Any] | None:
    import pyarrow as pa

    try:
        encoded = [v.encode() if type(v) is str else b"" for v in values]
    except UnicodeEncodeError:
        return None  # lone surrogates: pyarrow.array says what is wrong
    offsets = array("i")  # Arrow's int32 offsets
    try:
        offsets.extend(accumulate(map(len, encoded), initial=0))
    except OverflowError:
        return None  # over 2 GiB of text: pyarrow.array makes it a chunked array
    return [pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]


def _numbers(code: str, python_type: type[Any]) -> Callable[[list[Any]], list[Any]]:
    def build(values: list[Any]) -> list[Any]:
        import pyarrow as pa

        zero: Any = python_type()  # also what pyarrow writes under a null
        numbers: array[Any] = array(code, [v if type(v) is python_type else zero for v in values])
        return [pa.py_buffer(numbers)]

    return build


def _bools(values: list[Any]) -> list[Any]:
    return [_bitmap([v is True for v in values])]


_TYPE_OF = {str: "string", bool: "bool_", float: "float64", int: "int64"}
_PYTHON_TYPE = {"string": str, "bool": bool, "double": float, "int64": int}
_BUILDERS: dict[str, Callable[[list[Any]], list[Any] | None]] = {
    "string": _strings,
    "bool": _bools,
    "double": _numbers("d", float),
    "int64": _numbers("q", int),
}
assert array("i").itemsize == 4 and array("q").itemsize == 8 and array("d").itemsize == 8
