"""Where a request goes over HTTP: a codec, a transport, the rate limiter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from llm_kit import provider_json
from llm_kit.dialect_choice import DialectChoice
from llm_kit.endpoint_hints import explained
from llm_kit.errors import ProviderError
from llm_kit.providers.base import Backend, Codec, Completion
from llm_kit.ratelimit import RateLimiter
from llm_kit.redact import clip, redact_text
from llm_kit.schema import ResponseSchema
from llm_kit.transport import HttpTransport
from llm_kit.types import Message

_QUOTED_BODY = 120  # characters of an unreadable answer quoted in its error, at most


class HttpBackend(Backend):
    """``structured`` (OpenAI-compatible servers only) picks how a schema is asked for."""

    def __init__(
        self,
        codec: Codec,
        model: str,
        transport: HttpTransport,
        limiter: RateLimiter,
        structured: DialectChoice | None = None,
    ) -> None:
        self.codec = codec
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
        while True:  # ends: each pass uses a dialect further down a finite list
            dialect = self.structured.current
            body = self.codec.encode(self.model, messages, sampling, None)
            dialect.apply(body, schema)
            status, headers, raw = await self._post(body)
            if status >= 400 and self.structured.moved_on(dialect, status, raw):
                continue
            completion = self._decode(status, headers, raw)
            self.structured.worked(dialect)
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
            raise explained(error, self.codec.name, base, self._path, key_sent=keyed)
        try:
            return self.codec.decode(provider_json.loads(raw))
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
            # Redacted whole, then cut: a cut first could keep most of a key that no
            # redactor then recognises.
            text = redact_text(raw.decode("utf-8", "replace"), self.transport.secrets)
            quoted = repr(clip(text, _QUOTED_BODY))
            raise ProviderError(
                f"{self.codec.name} sent an answer that does not parse ({type(exc).__name__}: "
                f"{exc}): {quoted}",
                status=status,
                kind="bad_response",
                retryable=True,
            ) from None

    async def aclose(self) -> None:
        await self.transport.aclose()
