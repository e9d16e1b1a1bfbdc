"""Counting published rows: the counters a checkpoint, a rebuilt resume point and a
rewritten shard keep, from the rows themselves (one definition for all of them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmirage.rundir import ERRORS, RETRY, USAGE


def tally(into: Any, row: Mapping[str, Any]) -> None:
    """Add ``row`` to ``into``'s ``rows_done``, ``rows_failed``, ``rows_retryable`` (failed
    rows ``mmirage retry`` can run again) and token counters."""
    into.rows_done += 1
    into.rows_failed += bool(row.get(ERRORS))
    into.rows_retryable += row.get(RETRY) is not None
    usage = row.get(USAGE) or {}
    into.input_tokens += int(usage.get("input_tokens") or 0)
    into.output_tokens += int(usage.get("output_tokens") or 0)
