"""A provider's JSON read into Python values that can always be written again.

JSON may carry a lone UTF-16 surrogate as an escape (``"\\ud800"``: half of a pair, as a model
that stopped between the halves writes it). orjson refuses such a document; the standard
library reads it into a ``str`` that no UTF-8 file, SQLite store or JSON encoder accepts, so
one such answer would end every write of its shard. Every provider answer llm_kit decodes (a
live response body, a batch result line, the JSON an answer holds) is read here instead, and
each lone surrogate becomes U+FFFD: the paid answer is kept, as valid text, with a visible
mark where the provider's text was broken. Only a document orjson refuses pays for the
slower reading: every other answer is read as before.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

REPLACEMENT = "\ufffd"  # what a lone surrogate becomes


def loads(data: bytes | str) -> Any:
    """``data`` parsed as orjson does; a document orjson refuses for a lone surrogate is read
    by the standard library and mended (any other refusal is orjson's JSONDecodeError)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as refused:
        if "surrogate" not in str(refused):
            raise
        try:
            value = json.loads(data)
        except ValueError:
            raise refused from None
        return mend(value)


def mend(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (dict keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return mend_text(value)
    if isinstance(value, dict):
        return {mend(k): mend(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mend(v) for v in value]
    return value


def mend_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (a split pair is joined again)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text
