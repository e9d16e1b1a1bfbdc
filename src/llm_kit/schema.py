"""Pydantic response models → JSON schemas for the providers, and validation of answers."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from llm_kit.errors import ItemError, ResponseValidationError
from llm_kit.provider_json import mend
from llm_kit.redact import clip, redact_text

# Characters of a rejected answer quoted in its error, at most (redacted first, then cut).
_QUOTED_ANSWER = 120


@dataclass(frozen=True, slots=True)
class ResponseSchema:
    """A schema ready to send: a legal name, the plain JSON schema (``$ref``s inlined), and
    whether it fits OpenAI's strict subset (every property required, no free-form maps), in
    which case ``strict_schema`` is the same schema closed with ``additionalProperties: false``.
    """

    name: str
    schema: dict[str, Any]
    strict_schema: dict[str, Any] | None
    # The pydantic model it was made from (None for a plain dict): what answers validate against.
    model: type[BaseModel] | None = field(default=None, compare=False, repr=False)

    @property
    def strict(self) -> bool:
        return self.strict_schema is not None

    def fits(self, text: str | None) -> bool:
        """Whether ``text`` is JSON that fits the schema (for a plain dict: JSON at all)."""
        if self.model is None:
            return reads_as_json(text)
        try:
            parse_response(text, self.model)
        except ResponseValidationError:
            return False
        return True


@lru_cache(maxsize=512)
def response_schema(model: type[BaseModel]) -> ResponseSchema:
    """Built once per model class: items of one type share it."""
    try:
        raw = model.model_json_schema()
    except Exception as exc:  # pydantic raises several types for unschematisable fields
        raise ItemError(
            f"response_model {model.__name__} cannot become a JSON schema ({exc}); "
            "use JSON-compatible field types"
        ) from None
    schema = _inline_refs(raw, raw.get("$defs", {}), ())
    schema.pop("$defs", None)
    return replace(schema_from_dict(model.__name__, schema), model=model)


def schema_from_dict(name: str, schema: dict[str, Any]) -> ResponseSchema:
    """A schema given as a plain dict (callers that have no pydantic model use it directly)."""
    inlined = _inline_refs(schema, schema.get("$defs", {}), ())
    inlined.pop("$defs", None)
    safe = re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64] or "response"
    strict = _closed(inlined) if _fits_strict(inlined) else None
    return ResponseSchema(name=safe, schema=inlined, strict_schema=strict)


def _inline_refs(node: Any, defs: dict[str, Any], seen: tuple[str, ...]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            key = ref.split("/")[-1]
            if key in seen:
                raise ItemError(
                    f"response schema {key} is recursive; recursive models are not supported"
                )
            return _inline_refs(defs[key], defs, (*seen, key))
        return {k: _inline_refs(v, defs, seen) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs, seen) for v in node]
    return node


def _fits_strict(node: Any) -> bool:
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            props = node.get("properties", {})
            if set(node.get("required", [])) != set(props):
                return False
            if node.get("additionalProperties", False) is not False:
                return False  # a free-form map (dict[str, X]) has no strict form
        return all(_fits_strict(v) for v in node.values())
    if isinstance(node, list):
        return all(_fits_strict(v) for v in node)
    return True


def _closed(node: Any) -> Any:
    """The schema with ``additionalProperties: false`` on every object (OpenAI strict mode)."""
    if isinstance(node, dict):
        out = {k: _closed(v) for k, v in node.items()}
        if out.get("type") == "object":
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_closed(v) for v in node]
    return node


def parse_response(text: str | None, model: type[BaseModel]) -> BaseModel:
    """The model's JSON text → a validated instance; ResponseValidationError otherwise."""
    if text is None:
        raise ResponseValidationError("the model returned no text where JSON was expected")
    try:
        return model.model_validate(_loads_lenient(_strip_fence(text)))
    except orjson.JSONDecodeError as exc:
        raise ResponseValidationError(
            f"the answer is not valid JSON ({exc}): {clip(redact_text(text), _QUOTED_ANSWER)!r}"
        ) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(root)"
        raise ResponseValidationError(
            f"the answer does not match {model.__name__}: {where}: {first['msg']} "
            f"({exc.error_count()} error(s))"
        ) from None
    except Exception as exc:  # a validator of the model's own raised: this answer's failure
        raise ResponseValidationError(
            f"a validator of {model.__name__} raised {type(exc).__name__}: {exc}"
        ) from exc


def reads_as_json(text: str | None) -> bool:
    """Whether an answer is JSON at all, whatever its shape (in a fence or not)."""
    try:
        _loads_lenient(_strip_fence(text or ""))
    except orjson.JSONDecodeError:
        return False
    return True


def _loads_lenient(text: str) -> Any:
    """orjson, else the stdlib parser with strict=False: small models (and llama.cpp's JSON
    grammar) put raw newlines inside strings, which is unambiguous enough to accept."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as first:
        try:
            # A lone surrogate escape is read too, as U+FFFD (llm_kit.provider_json).
            return mend(json.loads(text, strict=False))
        except json.JSONDecodeError:
            raise first from None


def _strip_fence(text: str) -> str:
    """Small models often wrap JSON in a ```json fence; accept it."""
    stripped = text.strip()
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else stripped[3:]
        stripped = stripped.rsplit("```", 1)[0]
    return stripped
