"""A published row's token count, known or not yet."""

from __future__ import annotations

from typing import Any

from mmirage.rundir import USAGE, VARS


def add_spent(record: dict[str, Any], input_tokens: int, output_tokens: int) -> None:
    """Count tokens a row spent: in ``__usage__``, or, while a batch output is pending (its
    ``__usage__`` null: unknown until merge), with its variables, which merge adds to the
    batch's own count."""
    usage = record[USAGE]
    if usage is not None:
        usage["input_tokens"] += input_tokens
        usage["output_tokens"] += output_tokens
    elif input_tokens or output_tokens:
        spent = record[VARS].setdefault(USAGE, [0, 0])
        spent[0] += input_tokens
        spent[1] += output_tokens


def unknown_usage(record: dict[str, Any], input_tokens: int, output_tokens: int) -> None:
    """``record``'s ``__usage__`` is unknown (null) until merge: a batch output is pending;
    the tokens its live outputs spent ride with its variables (``add_spent``)."""
    record[USAGE] = None
    add_spent(record, input_tokens, output_tokens)
