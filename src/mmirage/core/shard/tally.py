"""Counting published rows: the counters a checkpoint, a rebuilt resume point and a
rewritten shard keep, from the rows themselves (one definition for all of them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import repeat
from typing import Any

from mmirage.rundir import ERRORS, RETRY, USAGE


def tally(into: Any, row: Mapping[str, Any]) -> None:
    """Add ``row`` to ``into``'s ``rows_done``, ``rows_failed``, ``rows_retryable`` (failed
    rows ``mmirage retry`` can run again) and token counters."""
    tally_rows(into, (row,))


def tally_rows(into: Any, rows: Iterable[Mapping[str, Any]]) -> None:
    """``tally`` for each of ``rows`` (the counters summed first, then added once). Rows are
    many: each column is read by ``map``, a loop in C, not by a Python step per row."""
    rows = rows if isinstance(rows, list) else list(rows)
    errors, retries = _column(rows, ERRORS), _column(rows, RETRY)
    usages = list(filter(None, _column(rows, USAGE)))  # a row without one counts nothing
    into.rows_done += len(rows)
    into.rows_failed += sum(map(bool, errors))
    into.rows_retryable += len(retries) - retries.count(None)
    into.input_tokens += _total(usages, "input_tokens")
    into.output_tokens += _total(usages, "output_tokens")


def _column(rows: list[Mapping[str, Any]], key: str) -> list[Any]:
    """Each row's ``key`` (``None`` where it has none)."""
    try:
        return list(map(dict.get, rows, repeat(key)))  # type: ignore[arg-type]
    except TypeError:  # a mapping that is not a dict
        return [row.get(key) for row in rows]


def _total(usages: list[Mapping[str, Any]], key: str) -> int:
    # Summed as read (a shard read back may hold floats), made an int once; values that are
    # not numbers (text, from a file a person edited) are read one by one, as int() reads them.
    values = _column(usages, key)
    try:
        return int(sum(filter(None, values)))
    except TypeError:
        return sum(int(value or 0) for value in values)
