"""The one redactor every error text passes before it leaves llm_kit (live and batch alike).

Some gateways quote the request's headers in their error bodies, and those texts end up in
result files, status files and logs. So a text loses the exact secrets it is given (the API
key, any auth header value) and anything that looks like a credential even when the exact key
is unknown: ``Bearer <token>``, an ``authorization``/``x-api-key``/``api_key`` header or field
value, and ``key=``/``token=`` query parameters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "***"
# Shorter "secrets" are not keys, and replacing them would shred ordinary words.
_MIN_SECRET_LENGTH = 4

# What a key or token is made of; 8 or more of them, so that prose ("a Bearer token",
# "export OPENAI_API_KEY=...") keeps its words.
_TOKEN = r"[A-Za-z0-9._~+/=-]{8,}"
_BEARER = re.compile(rf"(?i)\b(bearer\s+){_TOKEN}")
# A credential header or field and its value, as text, JSON or a Python repr quotes it.
_CREDENTIAL_FIELD = re.compile(
    r"(?i)((?:proxy-)?authorization|x-(?:goog-)?api-key|api[-_]?key|access[-_]?token)"
    rf"([\"']?\s*[:=]\s*[\"']?(?:bearer\s+|basic\s+)?){_TOKEN}"
)
_CREDENTIAL_QUERY = re.compile(rf"(?i)([?&](?:key|api_key|access_token|token)=){_TOKEN}")


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with each secret and each credential-looking value replaced by ``***``."""
    for secret in _usable(secrets):
        text = text.replace(secret, REDACTED)
    text = _BEARER.sub(rf"\g<1>{REDACTED}", text)
    text = _CREDENTIAL_FIELD.sub(rf"\g<1>\g<2>{REDACTED}", text)
    return _CREDENTIAL_QUERY.sub(rf"\g<1>{REDACTED}", text)


def redact(value: Any, secrets: Iterable[str | None] = ()) -> Any:
    """``value`` redacted at any depth: strings, and the strings inside dicts, lists and tuples
    (a provider's JSON answer may quote a key anywhere)."""
    words = _usable(secrets)
    return _redact(value, words)


def redact_bytes(body: bytes, secrets: Iterable[str | None] = ()) -> bytes:
    """An HTTP body redacted as text (undecodable bytes are kept as they were)."""
    text = body.decode("utf-8", "surrogateescape")
    cleaned = redact_text(text, secrets)
    return body if cleaned == text else cleaned.encode("utf-8", "surrogateescape")


def _redact(value: Any, words: list[str]) -> Any:
    if isinstance(value, str):
        return redact_text(value, words)
    if isinstance(value, Mapping):
        return {k: _redact(v, words) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, words) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact(v, words) for v in value)
    return value


def _usable(secrets: Iterable[str | None]) -> list[str]:
    # Longest first: a key that contains another key is blanked whole.
    words = {s for s in secrets if s and len(s) >= _MIN_SECRET_LENGTH}
    return sorted(words, key=len, reverse=True)


__all__ = ["REDACTED", "redact", "redact_bytes", "redact_text"]
