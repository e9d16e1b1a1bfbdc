"""What every wire format implements: encode a request, decode an answer, classify an error.

A codec is pure (no I/O): the transport sends what it encodes, so the live pipeline and the
provider batch files share one implementation per provider. ``Backend`` is what a live
request goes to: a codec over HTTP (llm_kit.backends) or an in-process model.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar, Self

import orjson

from llm_kit.errors import ProviderError
from llm_kit.hosts import server_name
from llm_kit.ratelimit import budget_spent
from llm_kit.redact import clip
from llm_kit.schema import ResponseSchema
from llm_kit.types import Completion, Message, RateLimitInfo

# Status codes worth another try (DESIGN.md, provider-wire-formats §5.3).
RETRYABLE_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
# What a request-validation failure looks like in a 5xx body (pydantic, FastAPI): servers such
# as llama-cpp-python's answer a request they cannot parse with HTTP 500.
_REQUEST_VALIDATION = re.compile(
    r"\bvalidation errors?\b|Input should be|Field required|Extra inputs are not permitted"
    r"|'loc': \(",
    re.IGNORECASE,
)
# Characters of an error body quoted in its message, at most (the transport redacted it whole).
_QUOTED_BODY = 300


class Codec(ABC):
    """One provider wire format."""

    name: ClassVar[str]
    default_base_url: ClassVar[str]
    # Whether the server may be any OpenAI-compatible one, each with its own way of taking a
    # response schema (llm_kit.dialects).
    speaks_dialects: ClassVar[bool] = False
    # The provider's finish reasons that mean "stopped by the token limit": ``decode`` sets
    # ``Completion.cut`` from them (a JSON answer so cut is ``truncated``, never re-asked).
    cut_reasons: ClassVar[frozenset[str]] = frozenset()
    # Who error texts say answered: the provider's name, or another server's host
    # (``answering_at``).
    speaker: str = ""

    def answering_at(self, base_url: str | None) -> Self:
        """This codec for requests to ``base_url``: its errors name that server's host when
        it is not the provider's own (``127.0.0.1:8080 answered HTTP 500``)."""
        self.speaker = server_name(self.name, self.default_base_url, base_url)
        return self

    @abstractmethod
    def path(self, model: str) -> str:
        """The request path, appended to the base URL."""

    @abstractmethod
    def auth_headers(self, api_key: str) -> dict[str, str]:
        """Headers that carry the key (and any fixed protocol headers)."""

    @abstractmethod
    def encode(
        self,
        model: str,
        messages: Sequence[Message],
        sampling: Mapping[str, Any],
        schema: ResponseSchema | None,
    ) -> dict[str, Any]:
        """The JSON body of one request. Raises ItemError for content the provider refuses."""

    @abstractmethod
    def decode(self, body: Any) -> Completion:
        """A successful response body → Completion."""

    @abstractmethod
    def rate_limits(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        """Rate-limit headers → RateLimitInfo, or None when the response carried none."""

    def error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        """An error response → ProviderError, with retryability and the server's wait."""
        message, kind = self._error_message(status, body)
        retryable = status in RETRYABLE_STATUS
        if status >= 500 and _REQUEST_VALIDATION.search(message):
            # The server's crash on a request it could not validate: the same request fails
            # the same way every time.
            retryable, kind = False, "invalid_request_error"
        should_retry = headers.get("x-should-retry")
        if should_retry == "true":
            retryable = True
        elif should_retry == "false":
            retryable = False
        if kind == "insufficient_quota":
            retryable = False
        return ProviderError(
            f"{self.speaker or self.name} answered HTTP {status}: {message}",
            status=status,
            kind=kind,
            retryable=retryable,
            retry_after=retry_after_seconds(headers),
            budget_spent=status == 429 and budget_spent(self.rate_limits(headers)),
        )

    def _error_message(self, status: int, body: bytes) -> tuple[str, str]:
        """(message, kind) from an error body; kind is the provider's code or type."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            text = clip(body.decode("utf-8", "replace").strip(), _QUOTED_BODY)
            return text or "no message", f"http_{status}"
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            kind = error.get("code") or error.get("type") or error.get("status")
            return str(error.get("message") or error), str(kind or f"http_{status}")
        return clip(str(data), _QUOTED_BODY), f"http_{status}"


class Backend(ABC):
    """Where a live request goes: a provider over HTTP (llm_kit.backends) or an in-process
    model (``ProviderSpec.in_process``)."""

    @abstractmethod
    async def complete(
        self,
        messages: Sequence[Message],
        sampling: Mapping[str, Any],
        schema: ResponseSchema | None,
    ) -> Completion:
        """One request → Completion; ProviderError or ItemError on failure."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str | None) -> float | None:
    """Go-style durations ('12ms', '1s', '6m0s', '1h2m3s') or plain seconds → seconds."""
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    total, matched = 0.0, False
    for number, unit in _DURATION.findall(value):
        total += float(number) * _UNIT_SECONDS[unit]
        matched = True
    return total if matched else None


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """`retry-after-ms` beats `retry-after` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            import time

            return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
        except (TypeError, ValueError):
            return None


def int_header(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None
