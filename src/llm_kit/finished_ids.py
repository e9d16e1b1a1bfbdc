"""The ids an output file already holds, kept on disk: resume in constant memory.

``batch_to_jsonl(resume=True)`` must know, for each item, whether the output file already
holds its id; a set of ten million ids would take gigabytes. Instead the scan spills every id
(with its flags: ok, retryable) into hash partitions on disk, then writes one index file in
which the ids of each hash bucket lie together. In memory stay only the buckets' offsets (at
most 1 MB) and, while the index is written, one partition of at most a few MB. A lookup reads
its bucket (about 1 KB; larger past 10^7 ids) with one ``pread`` and searches it for the exact
id: no false positive, whatever the hashes do, and no assumption about the order of the lines
(concurrency writes them out of order; a retry appends them at the end).

A line that appears twice keeps the file's last word: every step keeps the entries in file
order, so the later line of an id lies after the earlier one, and the lookup searches from
the end.

Temporary files live beside the output (their size is about the ids' bytes), unnamed: they
go with ``close`` or with the process, even one that crashes."""

from __future__ import annotations

import math
import os
import tempfile
from array import array
from enum import Enum
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO, cast

import orjson

from llm_kit.jsonl import (
    Checkpoint,
    Head,
    read_heads,
    repair_torn_tail,
    set_aside_if_unreadable,
)

_TAB = b"\t"
_FLAG = {True: b"t", False: b"f"}
_RETRYABLE_FLAGS = b"f\tt"  # ok false, retryable true
_RETRYABLE_END = _RETRYABLE_FLAGS + b"\n"
_PARTITION_BITS = 8  # 256 spill files: one is read back at a time (N/256 ids in memory)
_SPILL_EVERY = 16_384  # ids buffered before they go to the spill files (about 1 MB)
_IDS_PER_BUCKET = 64  # the bucket a lookup reads: ~64 ids, about a kilobyte (~76 at 10^7)
_MAX_BUCKET_BITS = 17  # the offsets table: at most 2**17 buckets, 1 MB, whatever N is
_PART_BYTES = 2 << 20  # a partition larger than this is split before it is read (N > ~10^8)
_SPLIT_BITS = 4
_ID_OF_ENTRY = itemgetter(slice(None, -4))  # b"id\tt\tf" -> b"id", at C speed in map()


class Finished(Enum):
    """What the output file says of an id."""

    ABSENT = "absent"  # no line: the item runs
    DONE = "done"  # its last line is a success or a final failure: skipped
    RETRYABLE = "retryable"  # its last line is a retryable failure: runs with retry_failed


def id_key(item_id: str) -> bytes:
    """The id as the output file writes it between its quotes (JSON-escaped)."""
    return orjson.dumps(item_id)[1:-1]


class FinishedIds:
    """Which ids an output file holds, and whether each one's last line is a retryable
    failure. Build with ``FinishedIds.scan(path)``; close (or use ``with``) to remove its
    temporary files."""

    def __init__(
        self,
        index: BinaryIO | None,
        offsets: array[int],
        bucket_bits: int,
        counts: tuple[int, int],
        checkpoint: Checkpoint,
    ) -> None:
        self._index = index
        self._fd = index.fileno() if index is not None else -1
        self._offsets = offsets  # bucket b's entries: [offsets[b], offsets[b + 1]) in the index
        self._shift = 64 - bucket_bits
        self._half = 1 << (bucket_bits - 1)  # hash() is signed: bucket = (h >> shift) + half
        # Lines, not distinct ids (an id retried has two until the retry compacts the file):
        # enough for a progress bar's total.
        self.lines, self.retryable_lines = counts
        self.repaired_bytes = checkpoint.repaired_bytes
        self.unreadable = checkpoint.unreadable
        self.scanned: tuple[Path, int] | None = None  # the file and its size when scanned

    @classmethod
    def empty(cls) -> FinishedIds:
        return cls(None, array("q", [0, 0]), 1, (0, 0), Checkpoint())

    @classmethod
    def scan(cls, path: Path) -> FinishedIds:
        """Read ``path`` once (cutting a torn last line first, setting unreadable lines aside
        as ``jsonl.scan`` does) and index its ids."""
        checkpoint = Checkpoint()
        if not path.exists():
            return cls.empty()
        checkpoint.repaired_bytes = repair_torn_tail(path)
        with _Spill(path.parent) as spill:
            with open(path, "rb") as f:
                for heads in read_heads(f, checkpoint):
                    spill.add(heads)
            spill.flush()
            set_aside_if_unreadable(path, checkpoint.unreadable)
            finished = spill.index(checkpoint)
        finished.scanned = (path, path.stat().st_size)
        return finished

    def __len__(self) -> int:
        return self.lines

    def last_line(self, item_id: str) -> Finished:
        """Whether the file holds ``item_id``, and how its last line ended."""
        return self.last_line_of_key(id_key(item_id))

    def last_line_of_key(self, key: bytes) -> Finished:
        """``last_line`` of the id whose ``id_key`` is ``key``."""
        if self._fd < 0:
            return Finished.ABSENT
        bucket = (hash(key) >> self._shift) + self._half
        start, end = self._offsets[bucket], self._offsets[bucket + 1]
        if start == end:
            return Finished.ABSENT
        # The byte before a bucket is the newline that ends the entry before it (the index
        # starts with one), so every entry in the block reads "\n<id>\t<ok>\t<retryable>\n";
        # the last one of the id is its last line in the output.
        block = os.pread(self._fd, end - start + 1, start - 1)
        at = block.rfind(b"\n" + key + b"\t")
        if at < 0:
            return Finished.ABSENT
        flags = block[at + len(key) + 2 : at + len(key) + 5]
        return Finished.RETRYABLE if flags == _RETRYABLE_FLAGS else Finished.DONE

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
            self._fd = -1

    def __enter__(self) -> FinishedIds:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Spill:
    """Entries ``<id>\t<ok>\t<retryable>`` (the flags ``t`` or ``f``) spilled into hash
    partitions, then written as one index."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.parts: list[list[bytes]] = [[] for _ in range(1 << _PARTITION_BITS)]
        self.files = [_unnamed_file(directory) for _ in self.parts]
        self.buffered = self.total = 0

    def add(self, heads: list[Head]) -> None:
        raw = cast(list[tuple[bytes, bytes, bytes]], heads)
        if heads and isinstance(heads[0][0], str):  # a block that took the full parse
            raw = [(id_key(str(i)), _FLAG[bool(ok)], _FLAG[bool(r)]) for i, ok, r in heads]
        # The fast path's heads are (id, b"t"|b"f", b"t"|b"f"): joined at C speed.
        entries = list(map(_TAB.join, raw))
        parts, shift, half = self.parts, 64 - _PARTITION_BITS, len(self.parts) // 2
        for entry, key in zip(entries, map(hash, map(_ID_OF_ENTRY, entries)), strict=True):
            parts[(key >> shift) + half].append(entry)
        self.buffered += len(entries)
        self.total += len(entries)
        if self.buffered >= _SPILL_EVERY:
            self.flush()

    def flush(self) -> None:
        for part, file in zip(self.parts, self.files, strict=True):
            if part:
                file.write(b"\n".join(part) + b"\n")
                part.clear()
        self.buffered = 0

    def __enter__(self) -> _Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        for file in self.files:
            file.close()

    def index(self, checkpoint: Checkpoint) -> FinishedIds:
        writer = _IndexWriter(self.directory, _bucket_bits(self.total))
        for number, file in enumerate(self.files):
            writer.place(file, number, _PARTITION_BITS)
        writer.index.flush()
        counts = (self.total, writer.retryable)
        return FinishedIds(writer.index, writer.offsets, writer.bucket_bits, counts, checkpoint)


class _IndexWriter:
    """Writes partitions, in hash order, bucket by bucket into the index file."""

    def __init__(self, directory: Path, bucket_bits: int) -> None:
        self.directory = directory
        self.bucket_bits = bucket_bits
        self.offsets = array("q")  # where each bucket starts; then where the last one ends
        self.retryable = 0
        self.index = _unnamed_file(directory)
        self.index.write(b"\n")
        self.position = 1

    def place(self, file: BinaryIO, number: int, bits: int) -> None:
        """Write partition ``number`` of ``2**bits`` (its entries are in ``file``), grouped
        by bucket in file order (an id's later line stays later); one too large to read at
        once is split into 16 finer partitions first, so memory stays bounded."""
        size = file.seek(0, os.SEEK_END)
        file.seek(0)
        if size > _PART_BYTES and bits + _SPLIT_BITS <= self.bucket_bits:
            for sub, part in enumerate(_split(file, bits, self.directory)):
                self.place(part, (number << _SPLIT_BITS) + sub, bits + _SPLIT_BITS)
            return
        text = file.read()
        file.close()  # its disk space goes back at once
        self.retryable += text.count(_RETRYABLE_END)
        per_part = 1 << (self.bucket_bits - bits)
        shift = 64 - self.bucket_bits
        first = number * per_part - (1 << (self.bucket_bits - 1))  # hash >> shift of bucket 0
        buckets: list[list[bytes]] = [[] for _ in range(per_part)]
        entries = text.split(b"\n")[:-1]
        del text
        for entry, key in zip(entries, map(hash, map(_ID_OF_ENTRY, entries)), strict=True):
            buckets[(key >> shift) - first].append(entry)
        del entries
        for bucket in buckets:
            self.offsets.append(self.position)
            if bucket:
                block = b"\n".join(bucket) + b"\n"
                self.index.write(block)
                self.position += len(block)
        if number == (1 << bits) - 1:  # the last partition: where the last bucket ends
            self.offsets.append(self.position)


def _split(file: BinaryIO, bits: int, directory: Path) -> list[BinaryIO]:
    """The entries of partition file ``file`` (of ``2**bits``) into 16 finer partitions."""
    parts = [_unnamed_file(directory) for _ in range(1 << _SPLIT_BITS)]
    shift, mask = 64 - bits - _SPLIT_BITS, (1 << _SPLIT_BITS) - 1
    rest = b""
    while chunk := file.read(1 << 20):
        chunk = rest + chunk
        cut = chunk.rfind(b"\n") + 1
        entries, rest = chunk[:cut].split(b"\n")[:-1], chunk[cut:]
        lists: list[list[bytes]] = [[] for _ in parts]
        for entry, key in zip(entries, map(hash, map(_ID_OF_ENTRY, entries)), strict=True):
            lists[(key >> shift) & mask].append(entry)
        for part, lines in zip(parts, lists, strict=True):
            if lines:
                part.write(b"\n".join(lines) + b"\n")
    file.close()
    return parts


def _bucket_bits(total: int) -> int:
    wanted = math.ceil(math.log2(max(total, 1) / _IDS_PER_BUCKET)) if total else 0
    return min(max(wanted, _PARTITION_BITS), _MAX_BUCKET_BITS)


def _unnamed_file(directory: Path) -> BinaryIO:
    """A file with no name on disk (Linux O_TMPFILE, else unlinked at once), beside the
    output: /tmp may be a RAM disk."""
    return tempfile.TemporaryFile(dir=directory, prefix=".llm_kit-ids-", buffering=0)
