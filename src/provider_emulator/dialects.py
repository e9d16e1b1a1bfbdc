"""``--dialect``: the structured-output forms an emulated OpenAI-compatible server takes.

Real servers differ (see ``llm_kit.dialects``). Each emulated one takes its own forms and
refuses the others as that server does: llama-cpp-python with HTTP 500 and a pydantic
validation message naming ``response_format`` (its route handler turns every exception, a
request that fails validation included, into a 500); the others with HTTP 400 naming the
parameter. In every dialect the emulated model also follows a JSON Schema that ends a system
message, as a client that can send no parameter at all asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from provider_emulator.config import DialectName
from provider_emulator.errors import RequestError
from provider_emulator.responder import Prompt


@dataclass(frozen=True, slots=True)
class ServerDialect:
    accepts: frozenset[str]  # forms: json_schema, json_object, guided_json, format
    object_schema: bool = False  # json_object + "schema" constrains the answer to the schema
    validation_500: bool = False  # a refused form is a 500 with a pydantic message


SERVER_DIALECTS: dict[DialectName, ServerDialect] = {
    "openai": ServerDialect(frozenset({"json_schema", "json_object"})),
    "vllm": ServerDialect(frozenset({"json_schema", "json_object", "guided_json"})),
    "llama_server": ServerDialect(frozenset({"json_schema", "json_object"}), object_schema=True),
    "llama_cpp_python": ServerDialect(
        frozenset({"json_object"}), object_schema=True, validation_500=True
    ),
    "ollama": ServerDialect(frozenset({"format"})),
    "plain": ServerDialect(frozenset()),
}


class Form(NamedTuple):
    name: str
    field: str  # the request field that carries it
    schema: dict[str, Any] | None  # None: any JSON


def apply_structured(body: dict[str, Any], prompt: Prompt, dialect: DialectName) -> None:
    """Set ``prompt.schema`` / ``prompt.json_mode`` from the request, or refuse the request."""
    server = SERVER_DIALECTS[dialect]
    for form in _forms(body):
        if form.name not in server.accepts:
            raise _refusal(dialect, server, form)
        if form.schema is None or (form.name == "json_object" and not server.object_schema):
            prompt.json_mode = True
        else:
            prompt.schema = form.schema
    if prompt.schema is None and not prompt.json_mode:
        prompt.schema = schema_in_instructions(prompt.messages)


def _forms(body: dict[str, Any]) -> list[Form]:
    forms = []
    spec = body.get("response_format")
    if isinstance(spec, dict):
        kind = spec.get("type")
        if kind == "json_schema":
            json_schema = spec.get("json_schema")
            schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
            if not isinstance(schema, dict):
                raise RequestError(
                    "Missing required parameter: 'response_format.json_schema'.",
                    param="response_format",
                    code="missing_required_parameter",
                )
            forms.append(Form("json_schema", "response_format", schema))
        elif kind == "json_object":
            forms.append(Form("json_object", "response_format", _schema(spec.get("schema"))))
    for name, field in (("guided_json", "guided_json"), ("format", "format")):
        if field in body:
            forms.append(Form(name, field, _schema(body[field])))
    return forms


def _schema(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _refusal(dialect: str, server: ServerDialect, form: Form) -> RequestError:
    if server.validation_500:
        # FastAPI's RequestValidationError as text, which llama-cpp-python sends as it is.
        if form.field == "response_format":
            error = (
                f"{{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
                f"'msg': \"Input should be 'text' or 'json_object'\", 'input': {form.name!r}, "
                "'ctx': {'expected': \"'text' or 'json_object'\"}}"
            )
        else:
            error = (
                f"{{'type': 'extra_forbidden', 'loc': ('body', {form.field!r}), "
                "'msg': 'Extra inputs are not permitted'}"
            )
        return RequestError(
            f"1 validation error:\n  {error}", status=500, kind="internal_server_error"
        )
    if form.field == "response_format":
        taken = sorted(f for f in server.accepts if f in ("json_schema", "json_object"))
        return RequestError(
            f"Invalid value for 'response_format.type': the {dialect} server takes "
            f"{' or '.join(['text', *taken])}.",
            param="response_format",
            code="invalid_value",
        )
    return RequestError(f"Unrecognized request argument supplied: {form.field}", param=form.field)


def schema_in_instructions(messages: list[dict[str, str]]) -> dict[str, Any] | None:
    """A JSON Schema on the last lines of a system message, or None."""
    for message in messages:
        if message["role"] != "system":
            continue
        text = message["content"]
        start = text.rfind("\n{")
        candidate = text[start + 1 :] if start >= 0 else text
        try:
            value = orjson.loads(candidate)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict) and ("type" in value or "properties" in value):
            return value
    return None


__all__ = ["SERVER_DIALECTS", "ServerDialect", "apply_structured"]
