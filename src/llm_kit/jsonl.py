"""The JSONL sink: one complete line per finished item. The output file is the checkpoint."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import orjson

from llm_kit.types import BatchResult

logger = logging.getLogger(__name__)

# Lines are written as {"id":"...","ok":true|false,"retryable":true|false,...} so that the
# resume scan can read those three fields with byte slicing instead of parsing whole lines
# (which may carry long responses). Any other shape falls back to a full parse.
_ID_PREFIX = b'{"id":"'
_OK_KEY = b'","ok":'
_TRUE = ord("t")
# "}\n" first: a match also proves that the line before it was whole (blocks start with "}\n").
_BLOCK_HEAD = re.compile(rb'\}\n\{"id":"([^"\\\n]*)","ok":(t|f)[a-z]+,"retryable":(t|f)')
_BLOCK_START = b"}\n"
_NUL = b"\x00"  # never in a JSON line (escaped as \u0000): a crash-zeroed block of the file
_FAILED = (b"f", False)  # the block path yields bytes flags, the line path booleans
_TRUE_FLAGS = (b"t", True)


@dataclass
class Checkpoint:
    """What an existing output file already holds."""

    done: set[str] = field(default_factory=set)  # ids with a final record (success or not)
    retryable: set[str] = field(default_factory=set)  # ids whose last record is a retryable error
    repaired_bytes: int = 0  # size of a torn last line that was cut off
    unreadable: int = 0  # lines that were not results: moved to ``<file>.unreadable``


def repair_torn_tail(path: Path) -> int:
    """Cut a last line that a crash left without its newline; return the bytes removed."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        # Walk back to the previous newline in blocks.
        end = size
        while end > 0:
            start = max(0, end - 65536)
            f.seek(start)
            block = f.read(end - start)
            cut = block.rfind(b"\n")
            if cut >= 0:
                keep = start + cut + 1
                f.truncate(keep)
                return size - keep
            end = start
        f.truncate(0)
        return size


def scan(path: Path) -> Checkpoint:
    """Read the ids already in ``path`` (repairing a torn last line first) into sets: fine for
    a batch job's output, whose manifest is in memory anyway; the live pipeline's resume uses
    ``llm_kit.finished_ids`` instead, which keeps them on disk."""
    checkpoint = Checkpoint()
    if not path.exists():
        return checkpoint
    checkpoint.repaired_bytes = repair_torn_tail(path)
    done, retryable = checkpoint.done, checkpoint.retryable
    with open(path, "rb") as f:
        for heads in read_heads(f, checkpoint):
            for item_id, ok, can_retry in heads:
                if isinstance(item_id, bytes):
                    item_id = item_id.decode()
                done.add(item_id)
                if ok in _FAILED and can_retry in _TRUE_FLAGS:
                    retryable.add(item_id)
                else:
                    retryable.discard(item_id)
    set_aside_if_unreadable(path, checkpoint.unreadable)
    return checkpoint


Head = tuple[bytes | str, bytes | bool, bytes | bool]
"""(id, ok, retryable) of one line: bytes from the fast path (the id as written, flags b"t" or
b"f"), str and bools from a full parse."""


def read_heads(
    f: BinaryIO, tally: Checkpoint, end: int | None = None, block_size: int = 1 << 20
) -> Iterator[list[Head]]:
    """The heads of the lines of ``f`` (up to byte ``end``), a block at a time, counting
    unreadable lines in ``tally``. Blocks are 1 MB: memory does not depend on the file."""
    for block in _blocks(f, block_size, end):
        # One regex pass over a block finds every line head at C speed; the pattern starts
        # with "}" and a newline, so it can only match at the start of a line whose previous
        # line ends in "}" (newlines inside JSON strings are escaped). As many matches as
        # lines, a block ending in "}\n" and no NUL byte: every line is whole and has a head.
        # A block with any other line takes the line-by-line path: a line is parsed in
        # full, and one that does not parse is not done.
        heads: list[Head] = _BLOCK_HEAD.findall(block)
        lines = block.count(b"\n") - 1
        if len(heads) != lines or not block.endswith(b"}\n") or _NUL in block:
            read = [_read_head(line) for line in block[2:].splitlines() if line.strip()]
            heads = [h for h in read if h is not None]
            tally.unreadable += len(read) - len(heads)
        yield heads


def set_aside_if_unreadable(path: Path, unreadable: int) -> None:
    if unreadable:
        aside = set_aside_unreadable(path)
        logger.warning(
            "%s: %d unreadable line(s) moved to %s; their items are run again",
            path,
            unreadable,
            aside,
        )


def set_aside_unreadable(path: Path) -> Path:
    """Move the lines of ``path`` that are not results to ``<path>.unreadable`` (appended:
    nothing is destroyed); ``path`` is rewritten through a temporary file and a rename."""
    aside = path.with_name(path.name + ".unreadable")
    tmp = path.with_name(path.name + ".compact")
    with open(path, "rb") as src, open(tmp, "wb") as keep, open(aside, "ab") as drop:
        for line in src:
            (keep if not line.strip() or _read_head(line) is not None else drop).write(line)
        keep.flush()
        os.fsync(keep.fileno())
    os.replace(tmp, path)
    return aside


def _blocks(f: BinaryIO, size: int = 1 << 20, end: int | None = None) -> Iterator[bytes]:
    """Whole lines, about ``size`` bytes at a time, each block preceded by ``"}\n"``."""
    rest = b""
    while block := f.read(size if end is None else min(size, end - f.tell())):
        block = rest + block
        cut = block.rfind(b"\n") + 1
        if cut:
            yield _BLOCK_START + block[:cut]
        rest = block[cut:]
    if rest:
        yield _BLOCK_START + rest + b"\n"


def _read_head(line: bytes) -> tuple[str, bool, bool] | None:
    """(id, ok, retryable) of one output line, or None for a line that is not a result."""
    end = line.find(_OK_KEY, 7)
    whole = line.rstrip(b"\r\n").endswith(b"}") and _NUL not in line
    if whole and end > 0 and line.startswith(_ID_PREFIX):
        raw = line[7:end]
        if b"\\" not in raw:
            ok = line[end + 7] == _TRUE
            # ',"retryable":' follows 'true' (4 bytes) or 'false' (5 bytes).
            return raw.decode(), ok, line[end + (24 if ok else 25)] == _TRUE
    try:
        record = orjson.loads(line)
        return str(record["id"]), bool(record.get("ok")), bool(record.get("retryable"))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


def encode_line(result: BatchResult) -> bytes:
    return orjson.dumps(result.to_dict(), option=orjson.OPT_APPEND_NEWLINE)


class JsonlWriter:
    """Appends results as whole lines handed to the OS at once, so that they outlive the
    process as soon as the call returns (nothing waits in a buffer of ours for a crash)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, result: BatchResult) -> None:
        self._write_all(encode_line(result))

    def write_many(self, results: list[BatchResult]) -> None:
        """One write() for a batch of lines: a system call per batch, not per line."""
        self._write_all(b"".join([encode_line(result) for result in results]))

    def _write_all(self, data: bytes) -> None:
        # A regular file takes the whole buffer at once unless the disk fills up or a signal
        # lands mid-way; the loop then writes the rest (a crash in between leaves a torn last
        # line, which the next resume cuts).
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def drop_superseded(path: Path, retried: set[str]) -> int:
    """Remove the earlier lines of ids in ``retried`` that now have a later record.

    Used after retrying failed items: the file keeps one line per id (the newest). Rewritten to
    a temporary file and renamed over the original, so a crash leaves one or the other whole.
    """
    last_line: dict[str, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f):
            item_id = _line_id(line)
            if item_id in retried:
                last_line[item_id] = number
    tmp = path.with_name(path.name + ".compact")
    dropped = 0
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for number, line in enumerate(src):
            item_id = _line_id(line)
            if item_id in retried and last_line.get(item_id) != number:
                dropped += 1
                continue
            dst.write(line)
        dst.flush()
        os.fsync(dst.fileno())
    os.replace(tmp, path)
    return dropped


def _line_id(line: bytes) -> str | None:
    head = _read_head(line)
    return head[0] if head else None


async def append_results(path: Path, results: AsyncIterator[BatchResult]) -> tuple[int, int]:
    """Append results to ``path``, keeping one line per id: ids already there are skipped,
    except those whose line is a retryable error, whose newer line replaces it. Returns
    (lines written, of which failures)."""
    checkpoint = scan(path)
    written = failed = 0
    replaced: set[str] = set()
    with JsonlWriter(path) as writer:
        async for result in results:
            if result.id in checkpoint.retryable:
                replaced.add(result.id)
            elif result.id in checkpoint.done:
                continue
            writer.write(result)
            written += 1
            failed += not result.ok
    if replaced:
        drop_superseded(path, replaced)
    return written, failed
