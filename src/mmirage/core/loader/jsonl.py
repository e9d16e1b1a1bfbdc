"""JSONL, streamed line by line.

Row ids: a row is a non-blank line; ``row_id`` is the 0-based count of non-blank lines before it.
A whitespace-only line is skipped silently and consumes no id (the original's HF ``json`` builder
ignores blank lines too, so shard boundaries match it). A malformed line does consume its id: it
cannot be told apart from a good one without parsing, and ids must not depend on parsing.

``num_rows`` and seeking come from one byte-level scan of the file (``bytes.count`` and a regex,
no JSON parsing), which also records a checkpoint at every block start so that a shard seeks near
its first line and only steps over at most one block of lines.
"""

from __future__ import annotations

import bisect
import re
import sys
from collections.abc import Iterator
from typing import Any

import orjson

from mmirage.core.loader.base import (
    BadRow,
    BadRowSink,
    OnBadRow,
    Opener,
    Row,
    RowReader,
    check_bounds,
    open_local,
    report_bad_row,
)

_loads = orjson.loads  # module-level so tests can count parses

DEFAULT_BLOCK_SIZE = 1 << 20
_BOM = b"\xef\xbb\xbf"
# Whitespace as bytes.strip() sees it, minus "\n" (the line separator).
_BLANK_FIRST = re.compile(rb"[ \t\r\x0b\x0c]*\n")
# A "\n" followed by a whitespace-only line; zero-width so runs of blank lines all count.
_BLANK_AFTER = re.compile(rb"\n(?=[ \t\r\x0b\x0c]*\n)")


def _blank_lines(segment: bytes) -> int:
    """Whitespace-only lines in ``segment``, which starts at a line start and ends with ``\\n``."""
    first = 1 if _BLANK_FIRST.match(segment) else 0
    return first + len(_BLANK_AFTER.findall(segment))


def _json_kind(value: object) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


class JsonlReader(RowReader):
    """One JSONL file (one split of a ``{split: path}`` mapping, or the whole dataset)."""

    def __init__(
        self,
        path: str,
        split: str | None = None,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        opener: Opener = open_local,
    ) -> None:
        super().__init__(split)
        self.path = path
        self._open = opener
        self._block_size = block_size
        # (byte offset, row id, physical lines before) at each scanned block start.
        self._checkpoints: list[tuple[int, int, int]] | None = None
        self._num_rows = 0

    @property
    def num_rows(self) -> int:
        self._scan()
        return self._num_rows

    def _scan(self) -> None:
        if self._checkpoints is not None:
            return
        checkpoints: list[tuple[int, int, int]] = []
        offset = rows = lines = 0
        carry = b""
        with self._open(self.path) as f:
            while block := f.read(self._block_size):
                data = carry + block
                cut = data.rfind(b"\n") + 1
                if cut == 0:  # a line longer than a block: keep reading
                    carry = data
                    continue
                segment, carry = data[:cut], data[cut:]
                checkpoints.append((offset, rows, lines))
                newlines = segment.count(b"\n")
                rows += newlines - _blank_lines(segment)
                lines += newlines
                offset += cut
        if carry.strip():  # a last line without "\n"
            rows += 1
        self._checkpoints, self._num_rows = checkpoints, rows

    def _seek_point(self, start: int) -> tuple[int, int, int]:
        if start == 0:
            return 0, 0, 0  # no scan needed to read from the top
        self._scan()
        assert self._checkpoints is not None
        at = bisect.bisect_right(self._checkpoints, start, key=lambda c: c[1]) - 1
        return self._checkpoints[at] if at >= 0 else (0, 0, 0)

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        on_bad_row: OnBadRow = "fail",
        bad_rows: BadRowSink | None = None,
    ) -> Iterator[Row]:
        start, stop = check_bounds(start, stop, None)
        if stop is not None and stop <= start:
            return
        offset, row_id, line_no = self._seek_point(start)
        split, end = self.split, sys.maxsize if stop is None else stop
        with self._open(self.path) as f:
            f.seek(offset)
            lines = enumerate(f, line_no + 1)
            if row_id < start:  # the rows before ``start`` are counted, not parsed
                for _, raw in lines:
                    if not raw.isspace():
                        row_id += 1
                        if row_id == start:
                            break
            loads = _loads
            # The common line takes the fewest steps: rows are many. A blank line or a byte
            # order mark is found when the line does not parse.
            for line_no, raw in lines:
                if row_id >= end:
                    return
                try:
                    data = loads(raw)
                except ValueError as exc:
                    if raw.isspace():
                        continue  # not a row: it takes no row id
                    data = _without_bom(raw) if line_no == 1 else exc
                if type(data) is dict:
                    yield Row(row_id, data, split)
                else:
                    bad = BadRow(self.path, line_no, _problem(data), row_id, split)
                    report_bad_row(bad, on_bad_row, bad_rows)
                row_id += 1


def _without_bom(raw: bytes) -> Any:
    """The first line's value after its byte order mark, or why it is not one."""
    try:
        return _loads(raw.removeprefix(_BOM))
    except ValueError as exc:
        return exc


def _problem(value: Any) -> str:
    """Why a line is not a row: the parse error, or what kind of JSON it holds."""
    if isinstance(value, ValueError):
        col = getattr(value, "colno", None)
        detail = getattr(value, "msg", str(value))
        return f"not valid JSON ({detail}{f' at column {col}' if col else ''})"
    return f"expected a JSON object, got {_json_kind(value)}"
