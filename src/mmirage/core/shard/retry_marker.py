"""The ``__retry__`` column: how a published row that failed for a retryable reason (a rate
limit, a server error, a timeout) remembers what it already paid for.

It is set only on a row whose every failure is retryable, and holds JSON text (it reads back
the same from JSONL, Parquet and HF) with the outputs that did succeed, their values and
tokens, and the tokens the failed attempts spent. ``mmirage retry`` (``row_retry``) computes
such a row again, taking the succeeded outputs from here instead of asking for them again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from mmirage.core.process.base import OutputResult

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


@dataclass
class Marker:
    kept: dict[str, OutputResult] = field(default_factory=dict)  # output name → its result
    spent_input_tokens: int = 0  # what the failed attempts cost (billed, but not kept)
    spent_output_tokens: int = 0


def retry_marker(
    variables: Mapping[str, Any],
    paid: Mapping[str, tuple[int, int]],
    input_tokens: int,
    output_tokens: int,
) -> str:
    """The marker of a row whose succeeded outputs are ``paid`` (name → tokens; their values
    in ``variables``) and whose outputs used ``input_tokens``/``output_tokens`` in all."""
    kept = {
        name: {"value": variables.get(name), "input_tokens": tin, "output_tokens": tout}
        for name, (tin, tout) in paid.items()
    }
    spent = [
        input_tokens - sum(t[0] for t in paid.values()),
        output_tokens - sum(t[1] for t in paid.values()),
    ]
    return orjson.dumps({"kept": kept, "spent": spent}, default=str, option=_OPTS).decode()


def read_marker(text: Any) -> Marker | None:
    """The marker in a row's ``__retry__`` value; ``None`` when the row has none or it cannot
    be read (the row then counts as failed for good: nothing is guessed)."""
    if not isinstance(text, str | bytes):
        return None
    try:
        data = orjson.loads(text)
        kept = {
            name: OutputResult(
                value=entry["value"],
                input_tokens=int(entry["input_tokens"]),
                output_tokens=int(entry["output_tokens"]),
            )
            for name, entry in data["kept"].items()
        }
        spent_in, spent_out = (int(t) for t in data["spent"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
    return Marker(kept, spent_in, spent_out)
