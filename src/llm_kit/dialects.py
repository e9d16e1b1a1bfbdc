"""How an OpenAI-compatible server is asked for JSON that fits a schema: one dialect per form.

Servers disagree. OpenAI, vLLM and SGLang take ``response_format: json_schema``; llama.cpp's
``llama-server`` that or ``json_object`` + ``schema``; llama-cpp-python's server only the
latter; vLLM also its own ``structured_outputs`` (older vLLM: ``guided_json``); Ollama's native
API ``format``; some servers take nothing, and then the schema goes in the prompt. A server
that does not know a field mostly ignores it with HTTP 200. ``structured_output="auto"``
starts with OpenAI's form and moves on along ``DIALECTS`` when a server refuses one or its
first answers show that it ignored one (see ``dialect_choice``).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from functools import cached_property
from typing import Any, ClassVar

import orjson

from llm_kit.schema import ResponseSchema

# Statuses that mean something other than "this parameter is not understood".
_NOT_A_REFUSAL = frozenset({401, 403, 404, 408, 409, 413, 429})


class Dialect(ABC):
    """One way of asking for schema-shaped JSON, applied to an OpenAI chat-completions body."""

    name: ClassVar[str]
    # The request fields a server's refusal of this dialect names.
    fields: ClassVar[tuple[str, ...]]

    @abstractmethod
    def apply(self, body: dict[str, Any], schema: ResponseSchema) -> None:
        """Add the schema to ``body`` (in place)."""

    def refused(self, status: int, error_body: bytes) -> bool:
        """Whether this error answer refuses the dialect itself.

        The body must name one of the dialect's fields: a 400 for one bad image must not move
        every later request to a weaker dialect. A 5xx counts too, because some servers
        (llama-cpp-python's) answer a request that fails their validation with HTTP 500.
        """
        if status < 400 or status in _NOT_A_REFUSAL or not self.fields:
            return False
        return self._names_a_field.search(error_body.decode("utf-8", "replace")) is not None

    @cached_property
    def _names_a_field(self) -> re.Pattern[str]:
        # Whole words: "format" must not match inside "response_format" or "information".
        words = "|".join(re.escape(field) for field in self.fields)
        return re.compile(rf"(?<![A-Za-z0-9_])(?:{words})(?![A-Za-z0-9_])", re.IGNORECASE)


class JsonSchemaDialect(Dialect):
    """OpenAI's structured outputs; also vLLM, SGLang, llama-server, Ollama's /v1."""

    name = "json_schema"
    fields = ("response_format", "json_schema")

    def apply(self, body: dict[str, Any], schema: ResponseSchema) -> None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": schema.name,
                "strict": schema.strict,
                "schema": schema.strict_schema or schema.schema,
            },
        }


class JsonObjectDialect(Dialect):
    """JSON mode with the schema beside it: llama-cpp-python's server and llama-server."""

    name = "json_object"
    fields = ("response_format", "json_object")

    def apply(self, body: dict[str, Any], schema: ResponseSchema) -> None:
        body["response_format"] = {"type": "json_object", "schema": schema.schema}


class StructuredOutputsDialect(Dialect):
    """vLLM's own parameter today (0.10 on; ``guided_json`` before)."""

    name = "structured_outputs"
    fields = ("structured_outputs",)

    def apply(self, body: dict[str, Any], schema: ResponseSchema) -> None:
        body["structured_outputs"] = {"json": schema.schema}


class GuidedJsonDialect(Dialect):
    """Older vLLM's parameter: vLLM 0.32 ignores it (HTTP 200, output not constrained)."""

    name = "guided_json"
    fields = ("guided_json",)

    def apply(self, body: dict[str, Any], schema: ResponseSchema) -> None:
        body["guided_json"] = schema.schema


class OllamaFormatDialect(Dialect):
    """Ollama's ``format``: the schema itself."""

    name = "ollama_format"
    fields = ("format",)

    def apply(self, body: dict[str, Any], schema: ResponseSchema) -> None:
        body["format"] = schema.schema


class PromptDialect(Dialect):
    """No parameter at all: the schema is stated in a system message, and only the answer's
    validation holds the model to it. Nothing to refuse, so it ends the fallback list."""

    name = "prompt"
    fields = ()
    INSTRUCTION = (
        "Answer with one JSON value and nothing else: no prose, no code fence. "
        "It must match this JSON Schema:"
    )

    def apply(self, body: dict[str, Any], schema: ResponseSchema) -> None:
        instruction = f"{self.INSTRUCTION}\n{orjson.dumps(schema.schema).decode()}"
        messages = body["messages"]
        first = messages[0] if messages else None
        # One system message, not two: some chat templates refuse a second one.
        if first and first.get("role") == "system" and isinstance(first.get("content"), str):
            messages[0] = {**first, "content": f"{first['content']}\n\n{instruction}"}
        else:
            messages.insert(0, {"role": "system", "content": instruction})


# The fallback order of "auto": the most precise form first, the prompt last.
DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in (
        JsonSchemaDialect(),
        JsonObjectDialect(),
        StructuredOutputsDialect(),
        GuidedJsonDialect(),
        OllamaFormatDialect(),
        PromptDialect(),
    )
}
STRUCTURED_OUTPUTS: tuple[str, ...] = ("auto", *DIALECTS)
NATIVE = DIALECTS["json_schema"]

__all__ = ["DIALECTS", "NATIVE", "STRUCTURED_OUTPUTS", "Dialect"]
