"""JSON bodies as a provider writes them, lone surrogates included.

orjson refuses a string holding a lone UTF-16 surrogate (``"\\ud800"``), which a real
provider's JSON can carry as an escape (a model's output cut between the two halves of a
pair). The emulator's ``escapes`` responder says such text on purpose, so bodies fall back to
the standard library, which writes it as that escape.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(data: Any, *, newline: bool = False) -> bytes:
    """``data`` as JSON bytes (a trailing newline with ``newline``); lone surrogates escaped."""
    try:
        return orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE if newline else None)
    except TypeError:  # "str is not valid UTF-8: surrogates not allowed"
        text = json.dumps(data, separators=(",", ":"))  # ensure_ascii: \ud800 stays an escape
        return (text + "\n" if newline else text).encode("ascii")
