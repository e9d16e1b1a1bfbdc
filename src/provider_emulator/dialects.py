"""``--dialect``: the structured-output forms an emulated OpenAI-compatible server takes.

Real servers differ (see ``llm_kit.dialects``), and each emulated one behaves as the real one
was measured to (docs/providers.md): it follows the forms it takes, refuses those its real
counterpart refuses, as that server does (llama-cpp-python with HTTP 500 and a pydantic
validation message naming ``response_format``: its route handler turns every exception into a
500; OpenAI with HTTP 400 naming the parameter), and ignores every other form with HTTP 200,
as vLLM, llama.cpp and llama-cpp-python do with a field they do not know: the answer is then
unconstrained (the echo responder's plain text). In every dialect the emulated model also
follows a JSON Schema that ends a system message, as a client that can send no parameter at
all asks.
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
    takes: frozenset[str]  # forms followed: json_schema, json_object, structured_outputs, ...
    refuses: frozenset[str] = frozenset()  # forms refused; any other is ignored with HTTP 200
    object_schema: bool = False  # json_object + "schema" constrains the answer to the schema
    validation_500: bool = False  # a refused form is a 500 with a pydantic message
    batch_api: bool = False  # serves /v1/files and /v1/batches (only OpenAI of these)


# The forms carried by a field of their own, not by response_format.
_OWN_FIELD_FORMS = frozenset({"structured_outputs", "guided_json", "format"})
SERVER_DIALECTS: dict[DialectName, ServerDialect] = {
    # OpenAI refuses a parameter it does not know (400 "Unrecognized request argument").
    "openai": ServerDialect(
        frozenset({"json_schema", "json_object"}), refuses=_OWN_FIELD_FORMS, batch_api=True
    ),
    # vLLM 0.10 on (0.32 measured): guided_json is gone, ignored with a 200.
    "vllm": ServerDialect(frozenset({"json_schema", "json_object", "structured_outputs"})),
    # vLLM before 0.10: guided_json, not yet structured_outputs.
    "vllm_legacy": ServerDialect(frozenset({"json_schema", "json_object", "guided_json"})),
    "llama_server": ServerDialect(frozenset({"json_schema", "json_object"}), object_schema=True),
    "llama_cpp_python": ServerDialect(
        frozenset({"json_object"}),
        refuses=frozenset({"json_schema"}),
        object_schema=True,
        validation_500=True,
    ),
    # Not measured here: a strict server that refuses all but its own form with a 400.
    "ollama": ServerDialect(
        frozenset({"format"}),
        refuses=frozenset({"json_schema", "json_object", "structured_outputs", "guided_json"}),
    ),
    # A server that knows no form: it ignores each with a 200, as real servers do.
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
        if form.name in server.refuses:
            raise _refusal(dialect, server, form)
        if form.name not in server.takes:
            continue  # ignored with HTTP 200: the answer is not constrained
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
    outputs = body.get("structured_outputs")
    if outputs is not None:  # vLLM's: {"json": schema} (or a regex, a grammar: not emulated)
        json_schema = outputs.get("json") if isinstance(outputs, dict) else None
        forms.append(Form("structured_outputs", "structured_outputs", _schema(json_schema)))
    for field in ("guided_json", "format"):
        if field in body:
            forms.append(Form(field, field, _schema(body[field])))
    return forms


def _schema(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def _refusal(dialect: str, server: ServerDialect, form: Form) -> RequestError:
    if server.validation_500:
        # FastAPI's RequestValidationError as text, which llama-cpp-python sends as it is (it
        # refuses only a response_format type it does not know: other fields it ignores).
        error = (
            f"{{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), "
            f"'msg': \"Input should be 'text' or 'json_object'\", 'input': {form.name!r}, "
            "'ctx': {'expected': \"'text' or 'json_object'\"}}"
        )
        return RequestError(
            f"1 validation error:\n  {error}", status=500, kind="internal_server_error"
        )
    if form.field == "response_format":
        taken = sorted(f for f in server.takes if f in ("json_schema", "json_object"))
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
