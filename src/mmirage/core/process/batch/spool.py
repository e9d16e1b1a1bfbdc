"""Chunk spools: request lines on disk, grouped into chunks as they arrive (streaming, O(n)).

One ``ChunkSpool`` per (processor, shard, modality) lives in
``<state>/batch/<processor>/shard-<k>-of-<n>/<modality>/``. Each chunk is two files written
together — ``chunk-000001.jsonl`` (the exact request lines that will be uploaded) and
``chunk-000001.ids`` (``custom_id<TAB>source_index<TAB>dataset`` per line) — plus
``chunk-000001.done`` (its receipt, written as soon as the provider accepted the batch) and
``chunk-000001.receipted`` once that receipt is in the receipt file, ``chunk-000001.remembered``
once the shard's answer store knows its requests were submitted. Requests are written before
the runner checkpoints their rows, so a killed shard loses none: a resumed run submits the
chunks that have no ``.done``, writes the receipts a kill left unwritten, and knows the
custom_ids already spooled for the rows it will process again (never spooled twice). A
recomputed shard (its configuration edited) drops the chunks never sent instead: their rows
are spooled again as the new configuration asks them.

A chunk closes when the next request would push it past ``max_bytes`` or it holds
``max_requests`` (``llm_kit``'s ``BatchLimits.admits``, the rule of both chunk planners):
``max_bytes`` is the uploaded file's size, so each line counts with its newline and exact
equality fits. A request whose line alone is larger is ``isolate``-d in a chunk of its own or
``reject``-ed with an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from llm_kit.providers.batch_backend import BatchLimits
from mmirage.errors import UserError

_CHUNK = re.compile(r"^chunk-(\d{6})\.jsonl$")


class OversizedRequestError(UserError, ValueError):
    """A request exceeds ``max_chunk_bytes`` under ``oversized_request_policy: reject``."""


@dataclass
class SpooledChunk:
    """A chunk's files and what they hold."""

    number: int
    path: Path  # the .jsonl of request lines
    count: int = 0
    bytes: int = 0  # the chunk file's size: its lines with their newlines
    oversized: bool = False
    flush_reason: str = ""

    @property
    def ids_path(self) -> Path:
        return self.path.with_suffix(".ids")

    @property
    def done_path(self) -> Path:
        return self.path.with_suffix(".done")

    @property
    def receipted_path(self) -> Path:
        return self.path.with_suffix(".receipted")

    @property
    def remembered_path(self) -> Path:
        return self.path.with_suffix(".remembered")

    def read_ids(self) -> Iterator[tuple[str, int, int]]:
        with open(self.ids_path, encoding="utf-8") as f:
            for line in f:
                custom_id, source_index, dataset = line.rstrip("\n").split("\t")
                yield custom_id, int(source_index), int(dataset)


@dataclass
class ChunkSpool:
    directory: Path
    max_bytes: int
    max_requests: int | None
    policy: str = "isolate"
    # custom_ids an earlier, interrupted run spooled in chunks not sent yet (filled by
    # recover(); a run never spools a row twice itself, so new ids are not kept: memory stays
    # O(1) in rows). Sent chunks are known to the shard's answer store instead.
    spooled: set[str] = field(default_factory=set)
    # Submitted chunks whose receipt line may be missing (killed between the two writes).
    unreceipted: list[SpooledChunk] = field(default_factory=list)
    # Submitted chunks the answer store may not know yet (killed before it was told).
    unremembered: list[SpooledChunk] = field(default_factory=list)
    _open: SpooledChunk | None = None
    _next: int = 1

    def recover(
        self, from_index: int = 0, *, keep_unsent: Callable[[SpooledChunk], bool] | None = None
    ) -> list[SpooledChunk]:
        """Read what an earlier run left: remember the ids spooled in unsent chunks for rows
        at or after ``from_index`` (the rows a resumed run will process again — earlier rows
        are checkpointed, so memory stays bounded by what was in flight), return the closed
        chunks that were never submitted (oldest first) and keep the last one open.
        ``keep_unsent`` (a recomputed shard): an unsent chunk it refuses is deleted."""
        self.directory.mkdir(parents=True, exist_ok=True)
        pending: list[SpooledChunk] = []
        for name in sorted(os.listdir(self.directory)):
            match = _CHUNK.match(name)
            if not match:
                continue
            chunk = SpooledChunk(int(match.group(1)), self.directory / name)
            self._next = max(self._next, chunk.number + 1)
            if not chunk.ids_path.exists():
                continue
            sent = chunk.done_path.exists()
            if not sent and keep_unsent is not None and not keep_unsent(chunk):
                chunk.ids_path.unlink()
                chunk.path.unlink(missing_ok=True)
                continue
            self._truncate_torn(chunk)
            for custom_id, source_index, _ in chunk.read_ids():
                if not sent and source_index >= from_index:
                    self.spooled.add(custom_id)
                chunk.count += 1
            chunk.bytes = chunk.path.stat().st_size
            if not sent and chunk.count:
                pending.append(chunk)
            elif sent and not chunk.receipted_path.exists():
                self.unreceipted.append(chunk)
            if sent and not chunk.remembered_path.exists():
                self.unremembered.append(chunk)
        if pending and not self._is_full(pending[-1]):
            self._open = pending.pop()
        return pending

    def add(
        self, custom_id: str, source_index: int, dataset: int, line: bytes
    ) -> list[SpooledChunk]:
        """Spool one request line (ending in a newline); return the chunks this closed."""
        return self.add_many([(custom_id, source_index, dataset, line)])

    def add_many(self, requests: list[tuple[str, int, int, bytes]]) -> list[SpooledChunk]:
        """Spool requests in order (one write per chunk and file); return the closed chunks."""
        closed: list[SpooledChunk] = []
        lines: list[bytes] = []
        ids: list[str] = []
        limits = BatchLimits(self.max_requests, self.max_bytes)
        for custom_id, source_index, dataset, line in requests:
            size = len(line)
            if size > self.max_bytes:
                if self.policy == "reject":
                    self._write(lines, ids)
                    raise OversizedRequestError(
                        f"the request '{custom_id}' is {size} bytes (with its newline), more "
                        f"than max_chunk_bytes ({self.max_bytes}); raise max_chunk_bytes, "
                        "shorten the prompt or images, or set oversized_request_policy: isolate"
                    )
                self._write(lines, ids)
                lines, ids = [], []
                closed += self._close("oversized_neighbour")
                chunk = self._start()
                chunk.oversized = True
                self._write([line], [f"{custom_id}\t{source_index}\t{dataset}\n"])
                chunk.count, chunk.bytes = 1, size
                closed += self._close("oversized_request")
                continue
            current = self._open
            if current is not None and not limits.admits(current.count, current.bytes, line):
                self._write(lines, ids)
                lines, ids = [], []
                closed += self._close("full_chunk")
            if self._open is None:
                self._start()
            assert self._open is not None
            lines.append(line)
            ids.append(f"{custom_id}\t{source_index}\t{dataset}\n")
            self._open.count += 1
            self._open.bytes += size
        self._write(lines, ids)
        return closed

    def close(self, reason: str = "finalize") -> list[SpooledChunk]:
        """Close the open chunk (end of the shard)."""
        return self._close(reason)

    def _start(self) -> SpooledChunk:
        self._open = SpooledChunk(self._next, self.directory / f"chunk-{self._next:06d}.jsonl")
        self._next += 1
        return self._open

    def _close(self, reason: str) -> list[SpooledChunk]:
        chunk, self._open = self._open, None
        if chunk is None or chunk.count == 0:
            return []
        chunk.flush_reason = reason
        return [chunk]

    def _write(self, lines: list[bytes], ids: list[str]) -> None:
        if not lines or self._open is None:
            return
        # Ids last: a line without its id is truncated away on recovery (see _truncate_torn).
        _append(self._open.path, b"".join(lines))
        _append(self._open.ids_path, "".join(ids).encode())

    def _is_full(self, chunk: SpooledChunk) -> bool:
        return chunk.bytes >= self.max_bytes or (
            self.max_requests is not None and chunk.count >= self.max_requests
        )

    @staticmethod
    def _truncate_torn(chunk: SpooledChunk) -> None:
        """A kill between the two appends leaves lines without ids (or a torn id line): keep
        exactly the requests that have both."""
        with open(chunk.ids_path, "rb") as f:
            data = f.read()
        if data and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]
            with open(chunk.ids_path, "wb") as f:
                f.write(data)
        keep = data.count(b"\n")
        with open(chunk.path, "rb+") as f:
            offset = 0
            for _ in range(keep):
                line = f.readline()
                if not line.endswith(b"\n"):
                    break
                offset += len(line)
            f.truncate(offset)


def _append(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def read_lines(chunk: SpooledChunk) -> list[bytes]:
    with open(chunk.path, "rb") as f:
        return [line for line in f if line.strip()]
