"""Where a request goes over HTTP: a codec, a transport, the rate limiter."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from llm_kit import provider_json
from llm_kit.dialect_choice import DialectChoice
from llm_kit.endpoint_hints import explained
from llm_kit.errors import DialectIgnoredError, ProviderError
from llm_kit.keys import NO_KEY, KeyChoice
from llm_kit.providers.base import Backend, Codec, Completion
from llm_kit.ratelimit import RateLimiter
from llm_kit.redact import clip, redact_text
from llm_kit.schema import ResponseSchema
from llm_kit.transport import HttpTransport
from llm_kit.types import Message, Usage

_QUOTED_BODY = 120  # characters of an unreadable answer quoted in its error, at most
_STARTS_AS_JSON = re.compile(r"\s*(?:[{\[\"]|```)")  # an object, array, string, or a fence


class HttpBackend(Backend):
    """``structured`` (OpenAI-compatible servers only) picks how a schema is asked for."""

    def __init__(
        self,
        codec: Codec,
        model: str,
        transport: HttpTransport,
        limiter: RateLimiter,
        structured: DialectChoice | None = None,
        key: KeyChoice = NO_KEY,
    ) -> None:
        self.codec = codec
        self.key_names = key.variables  # where the key came from: a refusal names them
        self.model = model
        self.transport = transport
        self.limiter = limiter
        self.structured = structured
        self._path = codec.path(model)

    async def complete(
        self,
        messages: Sequence[Message],
        sampling: Mapping[str, Any],
        schema: ResponseSchema | None,
    ) -> Completion:
        if schema is None or self.structured is None:
            body = self.codec.encode(self.model, messages, sampling, schema)
            return self._decode(*await self._post(body))
        choice = self.structured
        spent = Usage()  # every answer, those of a dialect found ignored too: all paid for
        while True:  # ends: each pass uses a dialect further down a finite list
            dialect = choice.in_use()
            body = self.codec.encode(self.model, messages, sampling, None)
            dialect.apply(body, schema)
            status, headers, raw = await self._post(body)
            if status >= 400 and choice.moved_on(dialect, status, raw):
                continue
            completion = self._decode(status, headers, raw)
            spent.input_tokens += completion.usage.input_tokens
            spent.output_tokens += completion.usage.output_tokens
            if choice.judges(dialect) and (fits := _fits_or_not(completion, schema)) is not None:
                try:
                    if choice.judged(dialect, fits):
                        continue  # the server ignored that dialect: again in the next one
                except DialectIgnoredError as exc:
                    exc.usage = spent  # the item's failure carries what it paid
                    raise
            completion.usage = spent
            return completion

    async def _post(self, body: dict[str, Any]) -> tuple[int, Mapping[str, str], bytes]:
        status, headers, raw = await self.transport.post_json(self._path, body)
        info = self.codec.rate_limits(headers)
        if info is not None:
            self.limiter.observe(info)
        return status, headers, raw

    def _decode(self, status: int, headers: Mapping[str, str], raw: bytes) -> Completion:
        if status >= 400:
            error = self.codec.error(status, headers, raw)
            base, keyed = self.transport.base_url, bool(self.transport.secrets)
            raise explained(error, self.key_names, base, self._path, key_sent=keyed)
        try:
            return self.codec.decode(provider_json.loads(raw))
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
            # Redacted whole, then cut: a cut first could keep most of a key that no
            # redactor then recognises.
            text = redact_text(raw.decode("utf-8", "replace"), self.transport.secrets)
            quoted = repr(clip(text, _QUOTED_BODY))
            raise ProviderError(
                f"{self.codec.speaker or self.codec.name} sent an answer that does not parse "
                f"({type(exc).__name__}: {exc}): {quoted}",
                status=status,
                kind="bad_response",
                retryable=True,
            ) from None

    async def aclose(self) -> None:
        await self.transport.aclose()


def _fits_or_not(completion: Completion, schema: ResponseSchema) -> bool | None:
    """Whether the answer is JSON that fits the schema; None where it tells nothing about the
    dialect that asked for it (a refusal; an answer cut at the token limit that starts as
    JSON). A server that follows a form carrying the schema sends nothing else: JSON that
    misses it shows the form ignored as well as prose does (JSON mode alone, or a prompt that
    asks for JSON). A cut answer that starts as prose was never held to JSON."""
    if completion.refusal:
        return None
    if completion.cut:
        return None if _STARTS_AS_JSON.match(completion.text or "") else False
    return schema.fits(completion.text)
