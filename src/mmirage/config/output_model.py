"""``output_schema`` → pydantic model, for ``llm_kit.BatchItem(response_model=...)``."""

from __future__ import annotations

import keyword
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from mmirage.config.schema_field import SchemaField

_PY_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


def is_python_field_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


def build_model(name: str, fields: tuple[SchemaField, ...]) -> type[BaseModel]:
    definitions: dict[str, Any] = {}
    for index, spec in enumerate(fields):
        # Names that are not Python identifiers (or shadow BaseModel attributes) go through an
        # alias, so any JSON key the user chose is still the key the model answers with.
        safe = is_python_field_name(spec.name) and not hasattr(BaseModel, spec.name)
        attr = spec.name if safe else f"field_{index}"
        alias = None if safe else spec.name
        definitions[attr] = (
            _annotation(spec, name),
            Field(alias=alias, description=spec.description),
        )
    model: type[BaseModel] = create_model(
        name,
        __config__=ConfigDict(extra="forbid", populate_by_name=True),
        **definitions,
    )
    return model


def _annotation(spec: SchemaField, owner: str) -> Any:
    if spec.choices:
        return Literal[spec.choices]
    if spec.type in _PY_TYPES:
        base = _PY_TYPES[spec.type]
        if spec.minimum is None and spec.maximum is None:
            return base
        return Annotated[base, Field(ge=spec.minimum, le=spec.maximum)]
    if spec.type == "object":
        return build_model(f"{owner}_{_title(spec.name)}", spec.properties)
    assert spec.items is not None
    item = _annotation(spec.items, owner)
    return Annotated[list[item], Field(min_length=spec.min_items, max_length=spec.max_items)]  # type: ignore[valid-type]


def _title(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "_" for ch in name)
    return cleaned[:1].upper() + cleaned[1:]
