"""A job's requests on disk: one JSON line each, read back one at a time by index.

Only the byte offsets of the lines stay in memory (8 bytes a request), so a 200 MB input costs
a few hundred KB. Shuffling the offsets shuffles the order the requests are answered in, and
thereby the order of the results, without holding any result in memory.
"""

from __future__ import annotations

import asyncio
import random
import time
from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO

import orjson

SLICE_S = 0.005  # longest stretch of work between two yields to the event loop


class BatchInput:
    """Lines of an open file by index; ``shuffle`` permutes the order (seeded).

    ``scratch`` is a file of the emulator's own (a spill of inline requests), removed on close.
    """

    def __init__(self, handle: BinaryIO, offsets: array[int], scratch: Path | None = None) -> None:
        self._handle = handle
        self._offsets = offsets
        self._scratch = scratch

    def __len__(self) -> int:
        return len(self._offsets)

    def shuffle(self, rng: random.Random) -> None:
        rng.shuffle(self._offsets)

    def read(self, index: int) -> bytes:
        self._handle.seek(self._offsets[index])
        return self._handle.readline()

    def close(self) -> None:
        self._handle.close()
        if self._scratch is not None:
            self._scratch.unlink(missing_ok=True)


class Slicer:
    """Cuts a long loop into slices of about SLICE_S, yielding to the event loop in between."""

    __slots__ = ("_count", "_started")

    def __init__(self) -> None:
        self._count = 0
        self._started = time.perf_counter()

    async def tick(self) -> bool:
        """Call once per step; True when it just yielded."""
        self._count += 1
        if self._count % 32 or time.perf_counter() - self._started < SLICE_S:
            return False
        await asyncio.sleep(0)
        self._started = time.perf_counter()
        return True


async def scan_lines(handle: BinaryIO) -> AsyncIterator[tuple[int, int, bytes]]:
    """(line number from 1, offset, line) of each non-blank line, yielding to the loop often."""
    offset = 0
    slicer = Slicer()
    for number, line in enumerate(handle, 1):
        if line.strip():
            yield number, offset, line
        offset += len(line)
        await slicer.tick()


class Spill:
    """Writes requests that came inline (in a JSON body) to a JSONL file, for a BatchInput."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = path.open("w+b")
        self._offsets: array[int] = array("q")
        self._size = 0

    def add(self, item: object) -> None:
        line = orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE)
        self._offsets.append(self._size)
        self._handle.write(line)
        self._size += len(line)

    def done(self) -> BatchInput:
        self._handle.flush()
        return BatchInput(self._handle, self._offsets, scratch=self.path)
