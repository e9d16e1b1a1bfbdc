"""Counting published rows: the counters a checkpoint, a rebuilt resume point and a
rewritten shard keep, from the rows themselves (one definition for all of them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mmirage.rundir import ERRORS, RETRY, USAGE


def tally(into: Any, row: Mapping[str, Any]) -> None:
    """Add ``row`` to ``into``'s ``rows_done``, ``rows_failed``, ``rows_retryable`` (failed
    rows ``mmirage retry`` can run again) and token counters."""
    tally_rows(into, (row,))


def tally_rows(into: Any, rows: Iterable[Mapping[str, Any]]) -> None:
    """``tally`` for each of ``rows`` (the counters summed first, then added once)."""
    done = failed = retryable = input_tokens = output_tokens = 0
    for row in rows:
        done += 1
        failed += bool(row.get(ERRORS))
        retryable += row.get(RETRY) is not None
        usage = row.get(USAGE) or {}
        input_tokens += int(usage.get("input_tokens") or 0)
        output_tokens += int(usage.get("output_tokens") or 0)
    into.rows_done += done
    into.rows_failed += failed
    into.rows_retryable += retryable
    into.input_tokens += input_tokens
    into.output_tokens += output_tokens
