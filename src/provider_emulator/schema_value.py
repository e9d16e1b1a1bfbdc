"""Make a JSON value that validates against a schema, so that echo answers parse.

Understands plain JSON Schema (as pydantic, OpenAI and Anthropic use it) and Gemini's
OpenAPI flavour (upper-case ``type``, ``nullable``, int64 bounds sent as strings). Values are
deterministic: strings carry the prompt's echo text, numbers sit inside their bounds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Past this depth only what the schema requires is generated, so recursive models end.
_OPTIONAL_DEPTH = 6
_MAX_DEPTH = 40

# Valid examples for the string formats that pydantic and the SDKs check.
_FORMATS: dict[str, str] = {
    "date-time": "2024-01-01T00:00:00Z",
    "date": "2024-01-01",
    "time": "00:00:00",
    "duration": "PT1S",
    "email": "echo@example.com",
    "idn-email": "echo@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "iri": "https://example.com/",
    "uri-reference": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "hostname": "example.com",
    "int64": "0",
    "byte": "ZWNobw==",
}


# google-genai sends some schema keywords in snake_case; the API accepts both spellings.
_CAMEL = {
    "min_items": "minItems",
    "max_items": "maxItems",
    "min_length": "minLength",
    "max_length": "maxLength",
    "min_properties": "minProperties",
    "max_properties": "maxProperties",
    "any_of": "anyOf",
    "property_ordering": "propertyOrdering",
}
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def value_for_schema(schema: Mapping[str, Any], text: str = "echo") -> Any:
    """A value valid under ``schema``; ``text`` seeds every free string."""
    root = camel_keywords(schema)
    return _Generator(root, text or "echo").value(root, 0, 0)


def camel_keywords(schema: Any) -> Any:
    """Rename snake_case keywords (never property names) to their camelCase spelling."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        key = _CAMEL.get(key, key)
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            value = {name: camel_keywords(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            value = [camel_keywords(sub) for sub in value]
        elif key in ("items", "additionalProperties", "not"):
            value = camel_keywords(value)
        out[key] = value
    return out


class _Generator:
    def __init__(self, root: Mapping[str, Any], text: str) -> None:
        self.root = root
        self.text = text

    def resolve(self, schema: Mapping[str, Any]) -> Mapping[str, Any]:
        """Follow ``$ref`` (a JSON pointer into the root) and merge ``allOf``."""
        seen = 0
        while "$ref" in schema and seen < _MAX_DEPTH:
            target: Any = self.root
            for token in str(schema["$ref"]).lstrip("#").split("/"):
                if token:
                    target = target[token.replace("~1", "/").replace("~0", "~")]
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            schema = {**target, **rest}
            seen += 1
        if "allOf" in schema:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in schema["allOf"]:
                part = self.resolve(part)
                props = {**merged.get("properties", {}), **part.get("properties", {})}
                required = [*merged.get("required", []), *part.get("required", [])]
                merged = {**part, **merged}
                if props:
                    merged["properties"] = props
                if required:
                    merged["required"] = list(dict.fromkeys(required))
            schema = merged
        return schema

    def value(self, schema: Any, depth: int, salt: int) -> Any:
        if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
            return None
        schema = self.resolve(schema)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][salt % len(schema["enum"])]
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                return self.value(self.pick(schema[key], depth), depth + 1, salt)
        kind = _type_of(schema)
        if kind == "null":
            return None
        if kind == "object":
            return self.object(schema, depth)
        if kind == "array":
            return self.array(schema, depth)
        if kind == "boolean":
            return salt % 2 == 0
        if kind == "integer":
            return _integer(schema, salt)
        if kind == "number":
            return _number(schema, salt)
        return self.string(schema, salt)

    def pick(self, options: list[Any], depth: int) -> Any:
        """Prefer a non-null branch; deep in a recursive model, prefer the null one."""
        resolved = [self.resolve(o) if isinstance(o, Mapping) else {} for o in options]
        nulls = [o for o in resolved if _type_of(o) == "null"]
        others = [o for o in resolved if _type_of(o) != "null"]
        if depth >= _OPTIONAL_DEPTH and nulls:
            return nulls[0]
        return (others or nulls)[0]

    def object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        props: Mapping[str, Any] = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        keep_optional = depth < _OPTIONAL_DEPTH
        return {
            name: self.value(sub, depth + 1, 0)
            for name, sub in props.items()
            if keep_optional or name in required
        }

    def array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        prefix = list(schema.get("prefixItems") or ())
        low = _int(schema.get("minItems"), 0)
        high = _int(schema.get("maxItems"), None)
        count = max(low, len(prefix) if prefix else (1 if depth < _OPTIONAL_DEPTH else 0))
        if high is not None:
            count = min(count, high)
        items = schema.get("items")
        out = []
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else items
            out.append(self.value(sub if isinstance(sub, Mapping) else {}, depth + 1, i))
        return out

    def string(self, schema: Mapping[str, Any], salt: int) -> str:
        fmt = schema.get("format")
        if isinstance(fmt, str) and fmt in _FORMATS:
            return _FORMATS[fmt]
        text = self.text if salt == 0 else f"{self.text} {salt}"
        low = _int(schema.get("minLength"), 0)
        high = _int(schema.get("maxLength"), None)
        if len(text) < low:
            text += "." * (low - len(text))
        if high is not None:
            text = text[:high]
        return text


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        non_null = [str(k).lower() for k in kind if str(k).lower() != "null"]
        return non_null[0] if non_null else "null"
    if isinstance(kind, str) and kind:
        kind = kind.lower()
        return "string" if kind == "type_unspecified" else kind
    if "properties" in schema:
        return "object"
    if "items" in schema or "prefixItems" in schema:
        return "array"
    return "string"


def _int(value: Any, default: int | None) -> Any:
    """Bounds may arrive as int64 strings (Gemini) or floats."""
    if value is None:
        return default
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return default


def _bounds(schema: Mapping[str, Any]) -> tuple[float, float, bool, bool]:
    low, high = -math.inf, math.inf
    low_open = high_open = False
    if schema.get("minimum") is not None:
        low = float(schema["minimum"])
    if schema.get("exclusiveMinimum") is not None and not isinstance(
        schema["exclusiveMinimum"], bool
    ):
        low, low_open = float(schema["exclusiveMinimum"]), True
    elif schema.get("exclusiveMinimum") is True:  # draft-4 boolean form
        low_open = True
    if schema.get("maximum") is not None:
        high = float(schema["maximum"])
    if schema.get("exclusiveMaximum") is not None and not isinstance(
        schema["exclusiveMaximum"], bool
    ):
        high, high_open = float(schema["exclusiveMaximum"]), True
    elif schema.get("exclusiveMaximum") is True:
        high_open = True
    return low, high, low_open, high_open


def _integer(schema: Mapping[str, Any], salt: int) -> int:
    low_f, high_f, low_open, high_open = _bounds(schema)
    low, high = -(2**53), 2**53
    if low_f != -math.inf:
        low = math.floor(low_f) + 1 if low_open else math.ceil(low_f)
    if high_f != math.inf:
        high = math.ceil(high_f) - 1 if high_open else math.floor(high_f)
    value = min(max(1 + salt, low), high)
    step = _int(schema.get("multipleOf"), 0)
    if step and step > 0 and value % step:
        up = value + step - value % step
        value = up if up <= high else value - value % step
    return int(value)


def _number(schema: Mapping[str, Any], salt: int) -> float:
    low, high, low_open, high_open = _bounds(schema)
    value = 1.0 + salt
    if schema.get("multipleOf"):
        return _multiple_number(schema, value)
    if value < low or (low_open and value <= low):
        value = low + 1.0 if high == math.inf else (low + high) / 2
    if value > high or (high_open and value >= high):
        value = high - 1.0 if low == -math.inf else (low + high) / 2
    return value


def _multiple_number(schema: Mapping[str, Any], start: float) -> float:
    step = float(schema["multipleOf"])
    low, high, _, _ = _bounds(schema)
    target = min(max(start, low), high)
    candidate = math.ceil(target / step) * step
    return candidate if candidate <= high else math.floor(target / step) * step


def to_json_schema(schema: Any) -> Any:
    """Gemini's OpenAPI flavour → plain JSON Schema (lower-case types, ``nullable`` as null)."""
    return _plain(camel_keywords(schema))


def _plain(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_plain(s) for s in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("nullable", "propertyOrdering"):
            continue
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key == "format" and value == "enum":
            continue
        elif key in ("properties", "$defs", "definitions") and isinstance(value, Mapping):
            out[key] = {name: _plain(sub) for name, sub in value.items()}
        elif key in ("minItems", "maxItems", "minLength", "maxLength") and isinstance(value, str):
            out[key] = _int(value, None)
        else:
            out[key] = _plain(value)
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out
