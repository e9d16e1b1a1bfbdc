"""CSV and TSV, streamed record by record; the first record is the header, every value is text.

Row ids: a row is a non-blank record after the header; ``row_id`` is the 0-based count of those
before it. A blank line takes no id (as in JSONL); a malformed record (a wrong number of fields,
a stray quote, bytes that are not UTF-8) does take its id, so the rows after it keep theirs.

A record may span lines (a quoted newline), so ``num_rows`` needs one parse of the file; that
scan also records a checkpoint (byte offset, row id, line) at a record start every block, so a
shard seeks near its first row and parses at most one block of records before it.
"""

from __future__ import annotations

import bisect
import csv
import sys
from collections.abc import Iterator
from typing import IO

from mmirage.core.loader.base import (
    BadRow,
    BadRowSink,
    DataError,
    OnBadRow,
    Opener,
    Row,
    RowReader,
    check_bounds,
    open_local,
    report_bad_row,
)

DEFAULT_BLOCK_SIZE = 1 << 20
DELIMITERS = {"CSV": ",", "TSV": "\t"}
_BOM = "\ufeff"

# A text column (a document, a transcript) easily passes the csv module's 128 KiB default; the
# limit is process-wide, and only ever raised here.
csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))


class _Lines:
    """The file's lines, decoded, for ``csv.reader``; counts the bytes and lines it handed out
    (the reader takes exactly the lines of one record per step, never more)."""

    def __init__(self, f: IO[bytes], offset: int, line_no: int) -> None:
        self._f, self.offset, self.line_no = f, offset, line_no

    def __iter__(self) -> _Lines:
        return self

    def __next__(self) -> str:
        raw = self._f.readline()
        if not raw:
            raise StopIteration
        self.offset += len(raw)
        self.line_no += 1
        # Undecodable bytes become lone surrogates: the record holding them is reported, the
        # rest of the file is read on.
        text = raw.decode("utf-8", "surrogateescape")
        return text.removeprefix(_BOM) if self.offset == len(raw) else text


class _Record:
    """One parsed record: its fields (or why it could not be parsed) and where it starts."""

    __slots__ = ("fields", "line", "offset", "problem")

    def __init__(self, fields: list[str], problem: str | None, line: int, offset: int) -> None:
        self.fields, self.problem, self.line, self.offset = fields, problem, line, offset


def _records(f: IO[bytes], offset: int, line_no: int, delimiter: str) -> Iterator[_Record]:
    """Every record from ``offset`` (a record start), blank lines included as empty records."""
    f.seek(offset)
    lines = _Lines(f, offset, line_no)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    while True:
        start, first_line = lines.offset, lines.line_no + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:  # the csv module drops the rest of the line and reads on
            yield _Record([], f"not a valid record ({exc})", first_line, start)
            continue
        yield _Record(fields, None, first_line, start)


class DelimitedReader(RowReader):
    """One CSV or TSV file with a header row; each row is ``{header: text}``."""

    def __init__(
        self,
        path: str,
        split: str | None = None,
        *,
        kind: str = "CSV",
        block_size: int = DEFAULT_BLOCK_SIZE,
        opener: Opener = open_local,
    ) -> None:
        super().__init__(split)
        self.path, self.kind = path, kind
        self._open = opener
        self._delimiter = DELIMITERS[kind]
        self._block_size = block_size
        self._header: list[str] | None = None
        self._checkpoints: list[tuple[int, int, int]] = []  # (offset, row id, line number)
        self._num_rows: int | None = None

    @property
    def header(self) -> list[str]:
        if self._header is None:
            self._header, offset, line = self._read_header()
            self._checkpoints = [(offset, 0, line)]
        return self._header

    def _read_header(self) -> tuple[list[str], int, int]:
        with self._open(self.path) as f:
            for record in _records(f, 0, 0, self._delimiter):
                if record.problem is None and not record.fields:
                    continue  # blank lines before the header
                self._check_header(record)
                return record.fields, record.offset, record.line
        raise DataError(
            f"{self.path}: the file is empty; a {self.kind} dataset needs a header row naming "
            "its columns"
        )

    def _check_header(self, record: _Record) -> None:
        where = f"{self.path}, line {record.line} (the header)"
        if record.problem is not None:
            raise DataError(f"{where}: {record.problem}; fix the header row")
        names = record.fields
        if any(not name.strip() for name in names):
            raise DataError(f"{where}: a column has no name; name every column of the header")
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise DataError(
                f"{where}: the column name {repeated[0]!r} appears more than once; give each "
                "column its own name"
            )
        if any(_not_utf8(name) for name in names):
            raise DataError(f"{where}: not UTF-8 text; save the file as UTF-8")

    @property
    def num_rows(self) -> int:
        if self._num_rows is None:
            self._scan()
        assert self._num_rows is not None
        return self._num_rows

    def _scan(self) -> None:
        self.header  # noqa: B018 (reading the header makes the first checkpoint)
        offset, rows, line = self._checkpoints[0]
        checkpoints = [(offset, rows, line)]
        with self._open(self.path) as f:
            for record in _records(f, offset, line - 1, self._delimiter):
                if record.problem is None and not record.fields:
                    continue
                if record.offset - checkpoints[-1][0] >= self._block_size:
                    checkpoints.append((record.offset, rows, record.line))
                rows += 1
        self._checkpoints, self._num_rows = checkpoints, rows - 1  # the header is no row

    def _seek_point(self, start: int) -> tuple[int, int, int]:
        """The last checkpoint at or before row ``start`` (the header's record: row -1)."""
        if start > 0:
            self.num_rows  # noqa: B018 (the scan makes the checkpoints)
        at = bisect.bisect_right(self._checkpoints, start, key=lambda c: c[1] - 1) - 1
        return self._checkpoints[max(at, 0)]

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        on_bad_row: OnBadRow = "fail",
        bad_rows: BadRowSink | None = None,
    ) -> Iterator[Row]:
        start, stop = check_bounds(start, stop, None)
        header = self.header
        end = sys.maxsize if stop is None else stop
        if end <= start:
            return
        offset, row_id, line = self._seek_point(start)
        row_id -= 1  # a checkpoint counts the header as a record
        with self._open(self.path) as f:
            for record in _records(f, offset, line - 1, self._delimiter):
                if record.problem is None and not record.fields:
                    continue
                if row_id >= end:
                    return
                if row_id >= start:
                    problem = record.problem or _field_problem(record.fields, header)
                    if problem is None:
                        yield Row(row_id, dict(zip(header, record.fields, strict=True)), self.split)
                    else:
                        bad = BadRow(self.path, record.line, problem, row_id, self.split)
                        report_bad_row(bad, on_bad_row, bad_rows)
                row_id += 1


def _not_utf8(text: str) -> bool:
    return any("\udc80" <= char <= "\udcff" for char in text)


def _field_problem(fields: list[str], header: list[str]) -> str | None:
    if len(fields) != len(header):
        return f"has {len(fields)} fields, the header has {len(header)}"
    if any(_not_utf8(value) for value in fields):
        return "not UTF-8 text"
    return None
