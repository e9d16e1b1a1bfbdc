"""`SchemaField`: one field of a JSON output's ``output_schema``, and its JSON schema.

Apart from the parser (``output_schema``) so that the pydantic side (``output_model``) can name
it without importing the parser, which builds its models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_JSON_TYPES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "object": "object",
    "list": "array",
}


@dataclass(frozen=True)
class SchemaField:
    """One field of a JSON answer (``name`` is ``""`` for a list's items)."""

    name: str
    type: str  # str | int | float | bool | object | list
    minimum: int | float | None = None
    maximum: int | float | None = None
    description: str | None = None
    properties: tuple[SchemaField, ...] = ()
    items: SchemaField | None = None
    min_items: int | None = None
    max_items: int | None = None
    choices: tuple[str, ...] = ()

    def json_schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": _JSON_TYPES[self.type]}
        if self.description:
            out["description"] = self.description
        if self.choices:
            out["enum"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.type == "object":
            out.update(object_schema(self.properties))
        if self.items is not None:
            out["items"] = self.items.json_schema()
        if self.min_items is not None:
            out["minItems"] = self.min_items
        if self.max_items is not None:
            out["maxItems"] = self.max_items
        return out


def object_schema(fields: tuple[SchemaField, ...]) -> dict[str, Any]:
    """A closed object's JSON schema: every field required, no other key allowed."""
    return {
        "properties": {f.name: f.json_schema() for f in fields},
        "required": [f.name for f in fields],
        "additionalProperties": False,
    }
