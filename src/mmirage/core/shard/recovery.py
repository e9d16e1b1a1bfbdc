"""Rebuilding a shard's resume point from what is durable: its part file's complete rows.

A checkpoint that cannot be read, or that does not fit its part file (an offset past the end
or inside a line), is not trusted; the part file's prefix of whole JSON rows is, and the row
key of its last row says where to read on. So is what a damaged published shard still
holds: ``salvage`` moves its readable rows back into the part file, and the shard resumes
after them, paying only for the rows that were lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from mmirage.core.loader import DatasetShard
from mmirage.core.shard.tally import tally
from mmirage.core.writer.formats import FormatError, iter_rows, jsonl_lines
from mmirage.rundir import ROW_KEY

logger = logging.getLogger(__name__)

Locate = Callable[[str], tuple[int, int] | None]
"""A row key → the cursor after that row: (range index, next row id); ``None``: not this
shard's row."""


@dataclass
class Durable:
    """What a part file's complete rows hold."""

    rows_done: int = 0
    rows_failed: int = 0
    rows_retryable: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    offset: int = 0  # bytes of those rows
    last_key: str | None = None


def scan_part(part: Path) -> Durable:
    """The prefix of whole JSON rows (each with a row key) at the start of ``part``."""
    found = Durable()
    try:
        f = open(part, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return found
    with f:
        for line in f:
            row = _row(line)
            if row is None:
                break
            tally(found, row)
            found.offset += len(line)
            found.last_key = row[ROW_KEY]
    return found


def _row(line: bytes) -> dict[str, Any] | None:
    if not line.endswith(b"\n"):
        return None  # torn
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return row if isinstance(row, dict) and isinstance(row.get(ROW_KEY), str) else None


def fits(part: Path, offset: int, rows: int) -> bool:
    """Whether the first ``offset`` bytes of ``part`` are exactly ``rows`` whole lines (a
    checkpoint's offset must be: inside a line, resuming would publish a torn one; short of
    its rows, they would be lost). One pass over those bytes, at resume only."""
    lines = 0
    try:
        with open(part, "rb") as f:
            left = offset
            while left > 0 and (chunk := f.read(min(left, 1 << 20))):
                lines += chunk.count(b"\n")
                left -= len(chunk)
                last = chunk[-1:]
    except OSError:
        return False
    return (offset == 0 and rows == 0) or (lines == rows and last == b"\n" and left == 0)


def locator(shard: DatasetShard) -> Locate:
    """Where ``shard`` reads on after a given row (keys are ``"<dataset>:<split>:<row id>"``)."""

    def locate(key: str) -> tuple[int, int] | None:
        dataset, _, rest = key.partition(":")
        split, _, row_id = rest.rpartition(":")
        if dataset != str(shard.dataset_index) or not row_id.isdigit():
            return None
        number = int(row_id)
        for index, r in enumerate(shard.ranges):
            if (r.split or "") == split and r.start <= number < r.stop:
                return index, number + 1
        return None

    return locate


def salvage(published: Path, part: Path) -> int:
    """Copy the readable rows of a damaged published shard, in order up to the first bad
    one, into ``part`` (replacing it); return how many."""
    part.parent.mkdir(parents=True, exist_ok=True)
    kept = 0
    with open(part, "wb") as out:
        if published.is_file() and published.suffix == ".jsonl":
            with open(published, "rb") as f:
                for line in f:
                    if _row(line) is None:
                        break
                    out.write(line)
                    kept += 1
        else:
            try:
                for batch in iter_rows(published):
                    out.write(jsonl_lines(batch))
                    kept += len(batch)
            except (FormatError, OSError, ValueError) as exc:
                logger.warning(
                    "%s: rows after the first %d cannot be read (%s)", published, kept, exc
                )
    return kept
