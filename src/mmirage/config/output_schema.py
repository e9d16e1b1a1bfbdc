"""The ``output_schema`` of a JSON output: the fields the model must answer with.

Accepted forms (mixable in one mapping):

* a list of names — every field is a string;
* ``name: type`` — ``str|string``, ``int|integer``, ``float|number``, ``bool|boolean``,
  ``object``, ``list[<type>]``;
* ``name: {type, min?, max?}`` for numbers (inclusive bounds), ``{type: str, enum: [...]}`` for a
  label from a fixed set, ``{type: object, properties: {...}}``
  for nested objects, ``{type: list|array, items: <type or mapping>, minItems?, maxItems?}``.

It becomes a JSON schema (every field required, closed objects) and a pydantic model for
``llm_kit.BatchItem(response_model=...)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from mmirage.config.errors import FieldError
from mmirage.config.schema_field import SchemaField, object_schema

__all__ = ["OutputSchema", "SchemaField", "parse_output_schema"]

_SCALARS = {
    "str": "str",
    "string": "str",
    "int": "int",
    "integer": "int",
    "float": "float",
    "number": "float",
    "bool": "bool",
    "boolean": "bool",
}
_CONTAINERS = {"object": "object", "dict": "object", "list": "list", "array": "list"}
_ALLOWED_KEYS = {
    "str": {"type", "description", "enum"},
    "bool": {"type", "description"},
    "int": {"type", "description", "min", "max"},
    "float": {"type", "description", "min", "max"},
    "object": {"type", "description", "properties"},
    "list": {"type", "description", "items", "minItems", "maxItems"},
}
_NUMERIC_STRING = re.compile(r"^-?\d+(\.\d+)?$")
_LIST_OF = re.compile(r"^(?:list|array)\[(.+)\]$")


@dataclass(frozen=True)
class OutputSchema:
    """The parsed ``output_schema`` of one JSON output."""

    fields: tuple[SchemaField, ...]

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]

    def json_schema(self) -> dict[str, Any]:
        return {"type": "object", **object_schema(self.fields)}

    def pydantic_model(self, name: str = "OutputSchema") -> type[Any]:
        from mmirage.config.output_model import build_model  # pydantic only when needed

        return build_model(name, self.fields)

    def __bool__(self) -> bool:
        return bool(self.fields)


def parse_output_schema(raw: Any, output_name: str) -> OutputSchema:
    """Parse and check; raises ``FieldError`` whose field is the sub-path inside the schema."""
    if raw is None:
        return OutputSchema(())
    return OutputSchema(_parse_fields(raw, output_name, ""))


def _parse_fields(raw: Any, out: str, prefix: str) -> tuple[SchemaField, ...]:
    fields: list[SchemaField] = []
    if isinstance(raw, list):
        for index, name in enumerate(raw):
            if not isinstance(name, str) or not name:
                raise FieldError(
                    f"{prefix}[{index}]",
                    f"output_schema of '{out}': a list entry must be a field name, got {name!r}",
                )
            fields.append(SchemaField(name=name, type="str"))
    elif isinstance(raw, dict):
        for name, spec in raw.items():
            fields.append(_parse_field(str(name), spec, out, _join(prefix, str(name))))
    else:
        raise FieldError(
            prefix,
            f"output_schema of '{out}' must be a list of field names or a mapping "
            f"of field name to type, got {type(raw).__name__}",
        )
    names = [f.name for f in fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise FieldError(prefix, f"output_schema of '{out}' repeats field(s) {duplicates}")
    return tuple(fields)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _parse_field(name: str, spec: Any, out: str, path: str) -> SchemaField:
    def fail(sub: str, problem: str) -> FieldError:
        return FieldError(_join(path, sub) if sub else path, f"{head}{problem}")

    head = f"Field '{name}' in output_schema of '{out}': "
    if spec is None:
        spec = "str"
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise fail("", f"expected a type name or a mapping with 'type', got {spec!r}")
    if "type" not in spec:
        raise fail("", "missing required key 'type'.")
    raw_type = spec["type"]
    ftype = _type_name(raw_type)
    if ftype is None:
        raise fail(
            "type",
            f"Unsupported type '{raw_type}'; use str, int, float, bool, object or list[<type>]",
        )
    list_of = _LIST_OF.match(raw_type.strip().lower()) if isinstance(raw_type, str) else None
    if list_of and "items" in spec:
        raise fail("items", "give the item type once: either list[<type>] or 'items'")
    unknown = sorted(set(spec) - _ALLOWED_KEYS[ftype])
    if unknown:
        if ftype not in ("int", "float") and {"min", "max"} & set(unknown):
            raise fail("min" if "min" in unknown else "max", _MIN_MAX_NUMERIC)
        raise fail(unknown[0], f"Unknown key(s) {unknown}; allowed: {sorted(_ALLOWED_KEYS[ftype])}")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise fail("description", "'description' must be a string")
    if ftype in ("int", "float"):
        low = _bound(spec.get("min"), "min", ftype, fail)
        high = _bound(spec.get("max"), "max", ftype, fail)
        if low is not None and high is not None and low > high:
            raise fail("min", f"min {low} cannot be greater than max {high}.")
        return SchemaField(name, ftype, low, high, description)
    if ftype == "object":
        props = spec.get("properties")
        if not isinstance(props, dict) or not props:
            raise fail("properties", "an object needs 'properties': a mapping of field to type")
        return SchemaField(
            name,
            "object",
            description=description,
            properties=_parse_fields(props, out, _join(path, "properties")),
        )
    if ftype == "list":
        item_spec = list_of.group(1) if list_of else spec.get("items")
        if item_spec is None:
            raise fail("items", "a list needs its item type: list[<type>] or 'items'")
        items = _parse_field(f"{name}[]", item_spec, out, _join(path, "items"))
        low_n = _count(spec.get("minItems"), "minItems", fail)
        high_n = _count(spec.get("maxItems"), "maxItems", fail)
        if low_n is not None and high_n is not None and low_n > high_n:
            raise fail("minItems", f"minItems {low_n} cannot be greater than maxItems {high_n}.")
        return SchemaField(
            name, "list", description=description, items=items, min_items=low_n, max_items=high_n
        )
    if ftype == "str" and "enum" in spec:
        choices = _choices(spec["enum"], fail)
        return SchemaField(name, "str", description=description, choices=choices)
    return SchemaField(name, ftype, description=description)


def _choices(value: Any, fail: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise fail("enum", "'enum' must be a non-empty list of strings, e.g. [positive, negative]")
    if len(set(value)) != len(value):
        raise fail("enum", f"'enum' repeats a value: {value}")
    return tuple(value)


_MIN_MAX_NUMERIC = "'min'/'max' are only allowed for numeric types"


def _type_name(raw: Any) -> str | None:
    if not isinstance(raw, str):
        return None
    text = raw.strip().lower()
    if _LIST_OF.match(text):
        return "list"
    return _SCALARS.get(text) or _CONTAINERS.get(text)


def _bound(value: Any, key: str, ftype: str, fail: Any) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise fail(key, f"'{key}' must be a number")
    if isinstance(value, str):
        if not _NUMERIC_STRING.match(value.strip()):
            raise fail(key, f"'{key}' must be a number")
        value = float(value) if "." in value else int(value)
    if ftype == "int":
        if float(value) != int(value):
            raise fail(key, f"'{key}' {value} must be a whole number for an int field")
        return int(value)
    return float(value)


def _count(value: Any, key: str, fail: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise fail(key, f"'{key}' must be a whole number >= 0")
    return value
