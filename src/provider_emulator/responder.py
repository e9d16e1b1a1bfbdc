"""Where the emulator's answers come from: a deterministic echo, or the embedded local model.

Each provider module turns its request into a neutral ``Prompt`` and a ``Reply`` back into its
own response shape, so a responder never sees a wire format.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from llm_kit.errors import ItemError
from provider_emulator.config import InvalidJson, ResponderName
from provider_emulator.errors import RequestError
from provider_emulator.schema_value import to_json_schema, value_for_schema

DEFAULT_MAX_TOKENS = 256  # when a request sets none (OpenAI, Gemini)
IMAGE_TOKENS = 85  # a flat, cheap estimate per image
_ECHO_CHARS = 200
_CHARS_PER_TOKEN = 4  # the emulator's flat token estimate
# What a model that ignores the schema says: JSON, but no object of any schema's fields.
OFF_SCHEMA_TEXT = '["this answer does not follow the requested schema"]'
_INSTALL_LOCAL = "pip install -e '.[local]' in the mmirage checkout"
_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")  # what the ``escapes`` responder decodes


@dataclass(slots=True)
class Prompt:
    """A request, provider-neutral. ``messages`` are OpenAI chat messages with text content."""

    model: str
    messages: list[dict[str, str]]
    max_tokens: int | None = None
    temperature: float | None = None
    schema: dict[str, Any] | None = None  # JSON Schema, or Gemini's OpenAPI flavour
    json_mode: bool = False  # any JSON object (OpenAI json_object, Gemini JSON mime type)
    tool: str | None = None  # a tool the answer must call (Anthropic's forced tool_use)
    chars: int = 0  # text characters in the request, for the token estimate
    images: int = 0

    @property
    def input_tokens(self) -> int:
        return self.chars // 4 + 1 + IMAGE_TOKENS * self.images

    @property
    def token_cost(self) -> int:
        """What a TPM budget charges up front: the input estimate plus the output cap."""
        return self.input_tokens + (self.max_tokens or DEFAULT_MAX_TOKENS)

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message["role"] == "user":
                return message["content"]
        return self.messages[-1]["content"] if self.messages else ""


@dataclass(slots=True)
class Reply:
    """An answer: ``text``, and ``value`` (the parsed JSON) when the prompt asked for JSON."""

    text: str
    input_tokens: int
    output_tokens: int
    value: Any = None
    truncated: bool = False  # stopped by max_tokens


class Responder(Protocol):
    async def respond(self, prompt: Prompt) -> Reply: ...


class EchoResponder:
    """ "echo: <last user text>", or a schema-valid JSON value built around that text; either
    cut at ``max_tokens`` (4 characters a token), as a model's answer is, JSON included."""

    async def respond(self, prompt: Prompt) -> Reply:
        echo = "echo: " + prompt.last_user_text()[:_ECHO_CHARS]
        value: Any = None
        if prompt.schema is not None:
            value = value_for_schema(prompt.schema, echo[:64])
            text = orjson.dumps(value).decode()
        elif prompt.json_mode:
            value = {"echo": echo}
            text = orjson.dumps(value).decode()
        else:
            text = echo
        limit = _CHARS_PER_TOKEN * (prompt.max_tokens or DEFAULT_MAX_TOKENS)
        if len(text) > limit:  # a cut JSON answer no longer parses: its value is gone too
            return Reply(text[:limit], prompt.input_tokens, limit // _CHARS_PER_TOKEN, None, True)
        return Reply(text, prompt.input_tokens, len(text) // _CHARS_PER_TOKEN + 1, value)


class VerbatimResponder:
    """The last user text itself, as plain text: a test decides exactly what the model says."""

    async def respond(self, prompt: Prompt) -> Reply:
        text = prompt.last_user_text()
        return Reply(text, prompt.input_tokens, len(text) // 4 + 1)


class EscapesResponder:
    """The last user text with its ``\\uXXXX`` escapes decoded, as plain text: a test makes the
    model say any code point, a lone UTF-16 surrogate included (which a request, being valid
    UTF-8, cannot carry; the answer's JSON then holds it as an escape, see ``wire_json``)."""

    async def respond(self, prompt: Prompt) -> Reply:
        text = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), prompt.last_user_text())
        return Reply(text, prompt.input_tokens, len(text) // 4 + 1)


class LocalResponder:
    """The embedded llama.cpp model (``llm_kit.local``): real, slow, offline answers."""

    def __init__(self) -> None:
        try:
            module = importlib.import_module("llm_kit.local")
            self._engine: Any = module.LocalEngine.shared()
        except ImportError as exc:
            raise RuntimeError(
                f"the 'local' responder needs the embedded model: {_INSTALL_LOCAL} ({exc})"
            ) from exc
        try:
            # Load now, so that a missing model fails at start rather than on every request.
            self._engine.load()
        except Exception as exc:
            raise RuntimeError(f"the 'local' responder cannot start: {exc}") from exc

    async def respond(self, prompt: Prompt) -> Reply:
        schema = None
        if prompt.schema is not None:
            schema = to_json_schema(prompt.schema)
        elif prompt.json_mode:
            schema = {"type": "object"}
        try:
            completion = await self._engine.complete(
                prompt.messages,
                max_tokens=prompt.max_tokens,
                temperature=prompt.temperature,
                json_schema=schema,
            )
        except ItemError as exc:  # e.g. a prompt longer than the context window
            raise RequestError(str(exc)) from None
        text = completion.text or ""
        value = None
        if schema is not None:
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError:
                value = None
        return Reply(
            text,
            completion.usage.input_tokens,
            completion.usage.output_tokens,
            value,
            truncated=completion.finish_reason in ("length", "max_tokens"),
        )


class OffSchemaResponder:
    """Another responder whose JSON answers miss the requested schema on purpose
    (``EmulatorConfig.invalid_json``): ``always``, or only in a conversation with no earlier
    assistant turn (``first``), so that a re-ask that quotes the bad answer gets a good one."""

    def __init__(self, inner: Responder, mode: InvalidJson) -> None:
        self.inner = inner
        self.mode = mode

    async def respond(self, prompt: Prompt) -> Reply:
        reply = await self.inner.respond(prompt)
        wants_json = prompt.schema is not None or prompt.json_mode
        if not wants_json or reply.truncated or not self._misses(prompt):  # a cut stays a cut
            return reply
        tokens = len(OFF_SCHEMA_TEXT) // _CHARS_PER_TOKEN + 1
        return Reply(OFF_SCHEMA_TEXT, reply.input_tokens, tokens)

    def _misses(self, prompt: Prompt) -> bool:
        if self.mode == "always":
            return True
        re_ask = any(m["role"] == "assistant" for m in prompt.messages)
        return self.mode == "first" and not re_ask


_RESPONDERS: dict[str, Callable[[], Responder]] = {
    "echo": EchoResponder,
    "local": LocalResponder,
    "verbatim": VerbatimResponder,
    "escapes": EscapesResponder,
}


def make_responder(name: ResponderName) -> Responder:
    """The responder a config names; the local one fails here, at start, when not installed."""
    return _RESPONDERS.get(name, EchoResponder)()
