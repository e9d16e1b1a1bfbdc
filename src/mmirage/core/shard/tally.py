"""Counting published rows: the counters a checkpoint, a rebuilt resume point and a
rewritten shard keep, from the rows themselves (one definition for all of them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mmirage.rundir import ERRORS, RETRY, USAGE

_NO_USAGE: Mapping[str, Any] = {}


def tally(into: Any, row: Mapping[str, Any]) -> None:
    """Add ``row`` to ``into``'s ``rows_done``, ``rows_failed``, ``rows_retryable`` (failed
    rows ``mmirage retry`` can run again) and token counters."""
    tally_rows(into, (row,))


def tally_rows(into: Any, rows: Iterable[Mapping[str, Any]]) -> None:
    """``tally`` for each of ``rows`` (the counters summed first, then added once; each a
    comprehension: rows are many)."""
    rows = rows if isinstance(rows, list) else list(rows)
    usages = [row.get(USAGE) or _NO_USAGE for row in rows]
    into.rows_done += len(rows)
    into.rows_failed += len([row for row in rows if row.get(ERRORS)])
    into.rows_retryable += len([row for row in rows if row.get(RETRY) is not None])
    into.input_tokens += _total(usages, "input_tokens")
    into.output_tokens += _total(usages, "output_tokens")


def _total(usages: list[Mapping[str, Any]], key: str) -> int:
    # Summed as read (a shard read back may hold floats), made an int once; values that are
    # not numbers (text, from a file a person edited) are read one by one, as int() reads them.
    values = [usage.get(key) or 0 for usage in usages]
    try:
        return int(sum(values))
    except TypeError:
        return sum(int(value) for value in values)
