"""The one redactor every text from a provider passes before it leaves llm_kit (live and
batch alike), *after* it is decoded and *before* it is cut.

Some gateways quote the request's headers in their error bodies, and those texts end up in
result files, status files and logs. So a text loses the exact secrets it is given (the API
key, any auth header value), any piece of one long enough to matter (a gateway or a cut may
have kept only part of it), and anything that looks like a credential even when the exact key
is unknown: ``Bearer <token>``, an ``authorization``/``x-api-key``/``api_key`` header or field
value, and ``key=``/``token=`` query parameters.

A key may also come escaped: JSON's ``\\u0073\\u006b…`` or ``\\/``, a Python repr's ``\\x..``,
URL ``%73`` or HTML ``&#115;`` forms, mixed, or escaped twice (a JSON string that holds JSON).
So a text is also read with its escapes undone, level by level; where such a reading reveals a
credential, that reading, redacted, replaces the text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

REDACTED = "***"
# Shorter "secrets" are not keys, and replacing them would shred ordinary words.
_MIN_SECRET_LENGTH = 4
# Any piece of a known secret this long is blanked too: a text cut before it reached llm_kit
# (by a gateway, say) may hold most of a key, and no ordinary text shares 12 characters in a
# row with a random key.
_MIN_PIECE = 12
# How many times a text is unescaped, at most, looking for a key (each pass undoes one level).
_MAX_LEVELS = 16

# What a key or token is made of; 8 or more of them, so that prose ("a Bearer token",
# "export OPENAI_API_KEY=...") keeps its words.
_TOKEN_CHARS = r"A-Za-z0-9._~+/=-"
_TOKEN = rf"[{_TOKEN_CHARS}]{{8,}}"
_BEARER = re.compile(rf"(?i)\b(bearer\s+){_TOKEN}")
# A credential header or field and its value, as text, JSON or a Python repr quotes it.
_CREDENTIAL_FIELD = re.compile(
    r"(?i)((?:proxy-)?authorization|x-(?:goog-)?api-key|api[-_]?key|access[-_]?token)"
    rf"([\"']?\s*[:=]\s*[\"']?(?:bearer\s+|basic\s+)?){_TOKEN}"
)
_CREDENTIAL_QUERY = re.compile(rf"(?i)([?&](?:key|api_key|access_token|token)=){_TOKEN}")

# One level of escapes: a JSON surrogate pair, \uXXXX, \u{X…}, \xXX, any other backslash
# escape, %XX; HTML's &#…; forms are undone by html.unescape.
_ESCAPE = re.compile(
    r"\\u(d[89ab][0-9a-f]{2})\\u(d[c-f][0-9a-f]{2})"
    r"|\\u([0-9a-f]{4})|\\u\{([0-9a-f]{1,6})\}|\\x([0-9a-f]{2})|\\(.)|%([0-9a-f]{2})",
    re.IGNORECASE | re.DOTALL,
)
_MAYBE_ESCAPED = re.compile(r"[\\%&]")
_JSON_CONTROL = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
# The end of a cut text, when it is part of a word a key could be (see ``clip``).
_TRAILING_TOKEN = re.compile(rf"[{_TOKEN_CHARS}]+\Z")
_TOKEN_CHAR = re.compile(rf"[{_TOKEN_CHARS}]")
_ELLIPSIS = "…"


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with each secret, each piece of one, and each credential-looking value
    replaced by ``***``, escaped forms included."""
    return _redact_text(text, _known(secrets))


def redact(value: Any, secrets: Iterable[str | None] = ()) -> Any:
    """``value`` redacted at any depth: strings (keys of mappings too), and the strings
    inside dicts, lists and tuples (a provider's JSON answer may quote a key anywhere)."""
    return _redact(value, _known(secrets))


def redact_bytes(body: bytes, secrets: Iterable[str | None] = ()) -> bytes:
    """An HTTP body redacted as what it decodes to: a JSON body's strings after JSON's own
    escapes are undone (re-encoded when anything was blanked), any other body as text
    (undecodable bytes are kept as they were)."""
    known = _known(secrets)
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    else:
        cleaned = _redact(value, known)
        if cleaned == value:
            return body
        try:
            return orjson.dumps(cleaned)
        except (TypeError, orjson.JSONEncodeError):
            pass  # not expected (a lone surrogate); the text form below is as safe
    text = body.decode("utf-8", "surrogateescape")
    cleaned_text = _redact_text(text, known)
    return body if cleaned_text == text else cleaned_text.encode("utf-8", "surrogateescape")


def clip(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters for an error message, never inside a word a
    key could be: a cut there would keep a prefix of the key that no redactor recognises, so
    that partial word is dropped too. Redact first, clip after."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    if _TOKEN_CHAR.match(text, limit):
        head = _TRAILING_TOKEN.sub("", head)
    return head + _ELLIPSIS


# -- the work ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Known:
    """The secrets of one call: the whole ones (longest first: a key that contains another
    key is blanked whole), and the pieces of the long ones, each with where it sits in which
    secret."""

    whole: tuple[str, ...]
    pieces: re.Pattern[str] | None
    places: Mapping[str, tuple[tuple[str, int], ...]]


def _known(secrets: Iterable[str | None]) -> _Known:
    words = {s for s in secrets if s and len(s) >= _MIN_SECRET_LENGTH}
    return _compiled(tuple(sorted(words, key=lambda s: (-len(s), s))))


@lru_cache(maxsize=64)
def _compiled(whole: tuple[str, ...]) -> _Known:
    places: dict[str, list[tuple[str, int]]] = {}
    for secret in whole:
        for start in range(len(secret) - _MIN_PIECE + 1):
            places.setdefault(secret[start : start + _MIN_PIECE], []).append((secret, start))
    pieces = re.compile("|".join(map(re.escape, places))) if places else None
    return _Known(whole, pieces, {k: tuple(v) for k, v in places.items()})


def _redact(value: Any, known: _Known) -> Any:
    if isinstance(value, str):
        return _redact_text(value, known)
    if isinstance(value, Mapping):
        return {_redact(k, known): _redact(v, known) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, known) for v in value]
    if isinstance(value, tuple):
        return tuple(_redact(v, known) for v in value)
    return value


def _redact_text(text: str, known: _Known) -> str:
    """The deepest unescaped reading of ``text`` that holds a credential, redacted; else
    ``text`` redacted as it is."""
    readings = [text]
    while len(readings) <= _MAX_LEVELS and _MAYBE_ESCAPED.search(readings[-1]):
        deeper = _unescape(readings[-1])
        if deeper == readings[-1]:
            break
        readings.append(deeper)
    for reading in reversed(readings[1:]):
        cleaned = _redact_plain(reading, known)
        if cleaned != reading:
            return cleaned
    return _redact_plain(text, known)


def _redact_plain(text: str, known: _Known) -> str:
    for secret in known.whole:
        text = text.replace(secret, REDACTED)
    if known.pieces is not None:
        text = _without_pieces(text, known)
    text = _BEARER.sub(rf"\g<1>{REDACTED}", text)
    text = _CREDENTIAL_FIELD.sub(rf"\g<1>\g<2>{REDACTED}", text)
    return _CREDENTIAL_QUERY.sub(rf"\g<1>{REDACTED}", text)


def _without_pieces(text: str, known: _Known) -> str:
    """Each run of ``text`` that is a piece of a secret (``_MIN_PIECE`` long or longer)
    blanked whole: a match of the first ``_MIN_PIECE`` characters is followed as far as the
    secret goes on."""
    assert known.pieces is not None
    out: list[str] = []
    pos = 0
    while (found := known.pieces.search(text, pos)) is not None:
        start = found.start()
        end = max(_run_end(text, start, s, at) for s, at in known.places[found.group()])
        out.append(text[pos:start] + REDACTED)
        pos = end
    return "".join(out) + text[pos:] if out else text


def _run_end(text: str, start: int, secret: str, at: int) -> int:
    length = _MIN_PIECE
    while (
        start + length < len(text)
        and at + length < len(secret)
        and text[start + length] == secret[at + length]
    ):
        length += 1
    return start + length


def _unescape(text: str) -> str:
    """``text`` with one level of escapes undone (see ``_ESCAPE``)."""
    text = _ESCAPE.sub(_unescaped, text)
    return html.unescape(text) if "&" in text else text


def _unescaped(match: re.Match[str]) -> str:
    high, low, four, braced, two, other, percent = match.groups()
    if high is not None:
        return chr(0x10000 + ((int(high, 16) - 0xD800) << 10) + int(low, 16) - 0xDC00)
    if other is not None:
        return _JSON_CONTROL.get(other, other)
    code = int(four or braced or two or percent, 16)
    if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
        return match.group()  # a lone surrogate is no text: left escaped
    return chr(code)


__all__ = ["REDACTED", "clip", "redact", "redact_bytes", "redact_text"]
