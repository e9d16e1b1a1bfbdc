"""The files a (dataset, shard)'s rows are in, and reading a few of them by offset.

A running shard's rows are in its part file (JSONL), a finished one's in its published shard
(JSONL, Parquet or an HF directory). Paths come only from the config (``rundir``): a request
names a dataset index, a shard number and an offset, never a path. A JSONL offset is a byte
offset (a seek, then a bounded read); an Arrow one is a row number (one record batch read).
No request reads a whole file.
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from mmirage.core.shard.output import ShardOutput
from mmirage.core.shard.remote_output import output_folder
from mmirage.core.writer.formats import FORMATS
from mmirage.errors import RowNotFound

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

CHUNK = 256 * 1024  # bytes read per step
SCAN_LIMIT = 8 * 1024 * 1024  # bytes one request looks through for matching rows, at most
PART, PUBLISHED = "part", "published"


@dataclass(frozen=True)
class RowFile:
    dataset: int
    shard: int
    where: str  # PART or PUBLISHED
    path: Path
    fmt: str  # jsonl, parquet or hf

    @property
    def size(self) -> int:
        try:
            if self.path.is_dir():
                return sum(p.stat().st_size for p in self.path.glob("*.arrow"))
            return self.path.stat().st_size
        except OSError:
            return 0

    @property
    def mtime(self) -> float:
        try:
            return self.path.stat().st_mtime
        except OSError:
            return 0.0


@dataclass(frozen=True)
class FoundRow:
    offset: int  # where the row starts (JSONL: byte; Arrow: row number)
    row: dict[str, Any]


@lru_cache(maxsize=65536)
def _candidates(output_dir: str, shard: int, num_shards: int, fmt: str) -> tuple[RowFile, ...]:
    """Where a (dataset, shard)'s rows may be, worked out once (``ShardOutput``'s paths): the
    published shard in ``fmt``, then in the other formats, then the part file. ``dataset`` is
    filled in by the caller."""
    out = ShardOutput(output_dir, shard, num_shards, fmt)  # type: ignore[arg-type]
    formats = (fmt, *(f for f in FORMATS if f != fmt))
    published = (RowFile(0, shard, PUBLISHED, out.path_for(f), f) for f in formats)  # type: ignore[arg-type]
    return (*published, RowFile(0, shard, PART, out.part, "jsonl"))


def _exists(file: RowFile) -> bool:
    try:
        mode = os.stat(file.path).st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) if file.fmt == "hf" else stat.S_ISREG(mode)


def row_files(config: MMirageConfig, dataset: int, shard: int) -> list[RowFile]:
    """The shard's published file first (when there is one), then its part file."""
    lp = config.loading_params
    if not (0 <= dataset < len(lp.datasets) and 0 <= shard < lp.num_shards):
        return []
    found: list[RowFile] = []
    # On object storage: the part files in the URL's mirror (published objects are not shown).
    folder = str(output_folder(lp, lp.datasets[dataset]))
    for file in _candidates(folder, shard, lp.num_shards, lp.output_format):
        if (file.where == PART or not found) and _exists(file):
            found.append(dataclasses.replace(file, dataset=dataset))
    return found


def row_file(config: MMirageConfig, dataset: int, shard: int, where: str) -> RowFile:
    for candidate in row_files(config, dataset, shard):
        if candidate.where == where:
            return candidate
    raise RowNotFound(f"dataset {dataset} shard {shard} has no {where} file")


def _decode(line: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None  # a torn last line of a running part file
    return value if isinstance(value, dict) else None


def jsonl_from(path: Path, offset: int, limit: int = SCAN_LIMIT) -> Iterator[FoundRow]:
    """Whole lines from byte ``offset`` on (which must start a line), ``limit`` bytes at most."""
    with open(path, "rb") as f:
        if offset > 0:
            f.seek(offset - 1)
            if f.read(1) != b"\n":
                raise RowNotFound(f"byte {offset} does not start a row")
        position, carry, read = offset, b"", 0
        while read < limit:
            chunk = f.read(CHUNK)
            if not chunk:
                return
            read += len(chunk)
            lines = (carry + chunk).split(b"\n")
            carry = lines.pop()  # no newline yet: not a whole row
            for line in lines:
                row = _decode(line)
                if row is not None:
                    yield FoundRow(position, row)
                position += len(line) + 1


def arrow_from(path: Path, fmt: str, offset: int) -> Iterator[FoundRow]:
    """Rows from row number ``offset`` on, one record batch at a time."""
    for position, batch in _arrow_batches(path, fmt, offset):
        if position + batch.num_rows <= offset:
            continue
        start = max(0, offset - position)
        for i, row in enumerate(batch.slice(start).to_pylist()):
            yield FoundRow(position + start + i, row)


def _arrow_batches(path: Path, fmt: str, offset: int) -> Iterator[tuple[int, Any]]:
    """(first row number, record batch) from the batch holding ``offset`` on, about: Parquet
    row groups before it are skipped by their metadata, unread; an HF shard's Arrow files are
    memory-mapped, so the batches stepped over are never copied or decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    position = 0
    if fmt == "parquet":
        parquet = pq.ParquetFile(path)
        for group in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            if position + rows <= offset:
                position += rows
                continue
            for batch in parquet.iter_batches(batch_size=1024, row_groups=[group]):
                yield position, batch
                position += batch.num_rows
        return
    for part in sorted(path.glob("*.arrow")):
        with pa.memory_map(str(part)) as source:
            for batch in pa.ipc.open_stream(source):
                yield position, batch
                position += batch.num_rows


def rows_from(file: RowFile, offset: int) -> Iterator[FoundRow]:
    if file.fmt == "jsonl":
        return jsonl_from(file.path, offset)
    return arrow_from(file.path, file.fmt, offset)


def one_row(file: RowFile, offset: int) -> FoundRow:
    for found in rows_from(file, offset):
        if found.offset == offset:
            return found
        break
    raise RowNotFound(f"no row at offset {offset} of dataset {file.dataset} shard {file.shard}")


def tail(file: RowFile, count: int) -> list[FoundRow]:
    """The file's last ``count`` rows (JSONL: read from the end; Arrow: the last batch)."""
    if file.fmt == "parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(file.path)
        total = parquet.metadata.num_rows
        if not total:
            return []
        last = parquet.read_row_group(parquet.num_row_groups - 1).to_pylist()[-count:]
        return [FoundRow(total - len(last) + i, row) for i, row in enumerate(last)]
    if file.fmt != "jsonl":
        return _arrow_tail(file, count)
    return _jsonl_tail(file.path, count)


def _arrow_tail(file: RowFile, count: int) -> list[FoundRow]:
    """An HF shard's last ``count`` rows: its memory-mapped batches are stepped over, only
    those holding the last rows are decoded (the others never become Python objects)."""
    if count <= 0:
        return []
    kept: deque[tuple[int, Any]] = deque()  # (first row number, batch), the last ones
    held = 0
    for position, batch in _arrow_batches(file.path, file.fmt, 0):
        kept.append((position, batch))
        held += batch.num_rows
        while held - kept[0][1].num_rows >= count:  # the oldest is not needed for ``count``
            held -= kept.popleft()[1].num_rows
    rows = [
        FoundRow(position + i, row)
        for position, batch in kept
        for i, row in enumerate(batch.to_pylist())
    ]
    return rows[-count:]


def _jsonl_tail(path: Path, count: int) -> list[FoundRow]:
    """The last ``count`` whole lines, read backwards a block at a time."""
    step = 16 * 1024
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        start, data = end, b""
        while start > 0 and data.count(b"\n") <= count:
            start = max(0, start - step)
            f.seek(start)
            data = f.read(end - start)
    lines = data.split(b"\n")[:-1]  # the last piece has no newline yet: not a whole row
    if start > 0:
        start += len(lines[0]) + 1  # the first piece may be a part of a line
        lines = lines[1:]
    found: list[FoundRow] = []
    position = start
    offsets = []
    for line in lines:
        offsets.append(position)
        position += len(line) + 1
    for offset, line in list(zip(offsets, lines, strict=True))[-count:]:
        row = _decode(line)
        if row is not None:
            found.append(FoundRow(offset, row))
    return found
