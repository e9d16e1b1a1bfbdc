"""Failed rows grouped by kind, counted in the background over every row file.

A row's ``__errors__`` holds one sentence per failed output, ending with its kind in
parentheses (``(truncated)``, ``(rate_limit)``…: llm_kit's ``error_kind``). Counting them
means reading every row once, too slow for a page at millions of rows, so a thread reads the
files a bit at a time, remembering how far it got in each (a part file only grows; a file
that shrank or was replaced is counted again), and the page shows what it has counted so far.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mmirage.rundir import ERRORS, RETRY
from mmirage.view.rowfiles import FoundRow, RowFile, jsonl_from, rows_from

_KIND = re.compile(r"\(([a-z][a-z0-9_]*)\)\s*$")
# Bytes one pass reads of a file at most: the next pass (seconds later) reads on.
PASS_LIMIT = 256 * 1024 * 1024
OTHER = "other"


def error_kind(sentence: Any) -> str:
    found = _KIND.search(str(sentence))
    return found.group(1) if found else OTHER


def row_failures(row: Mapping[str, Any]) -> dict[str, str]:
    """The row's failed outputs: output name → its sentence."""
    errors = row.get(ERRORS)
    if isinstance(errors, str):  # Arrow formats may keep it as JSON text
        import orjson

        try:
            errors = orjson.loads(errors)
        except orjson.JSONDecodeError:
            return {"row": errors}
    return {str(k): str(v) for k, v in errors.items()} if isinstance(errors, dict) else {}


@dataclass
class Group:
    count: int = 0
    retryable: int = 0
    example: str = ""  # the first sentence seen
    where: tuple[int, int, str, int] | None = None  # dataset, shard, file, offset of a row


@dataclass
class _FileProgress:
    offset: int = 0
    identity: tuple[int, float] = (0, 0.0)  # size and mtime when counted (Arrow formats)
    groups: dict[str, Group] = field(default_factory=dict)


class FailureCounter:
    """Counts failures of ``files()`` in a daemon thread; ``groups()`` is the tally so far."""

    def __init__(self, files: Callable[[], Iterable[RowFile]], pause_s: float = 2.0) -> None:
        self._files = files
        self._pause_s = pause_s
        self._progress: dict[tuple[int, int, str], _FileProgress] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.passes = 0  # whole passes over the files finished

    def start(self) -> None:
        threading.Thread(target=self._loop, name="view-failures", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def groups(self) -> dict[str, Group]:
        merged: dict[str, Group] = {}
        with self._lock:
            progress = list(self._progress.values())
        for entry in progress:
            for kind, group in entry.groups.items():
                into = merged.setdefault(kind, Group(example=group.example, where=group.where))
                into.count += group.count
                into.retryable += group.retryable
        return dict(sorted(merged.items(), key=lambda item: -item[1].count))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.count_once()
            self._stop.wait(self._pause_s)

    def count_once(self) -> None:
        seen = set()
        for file in self._files():
            key = (file.dataset, file.shard, file.where)
            seen.add(key)
            try:
                self._count(key, file)
            except (OSError, ValueError, LookupError):
                continue  # replaced while read (published, recomputed): the next pass
        with self._lock:
            for gone in set(self._progress) - seen:
                del self._progress[gone]
        self.passes += 1

    def _count(self, key: tuple[int, int, str], file: RowFile) -> None:
        identity = (file.size, file.mtime)
        with self._lock:
            entry = self._progress.get(key)
        if entry is not None and file.fmt != "jsonl" and entry.identity == identity:
            return
        if entry is None or identity[0] < entry.offset or file.fmt != "jsonl":
            entry = _FileProgress()  # new, shrunk (rewritten) or an Arrow file: from the start
        fresh = _FileProgress(
            entry.offset, identity, {k: Group(**vars(g)) for k, g in entry.groups.items()}
        )
        last = fresh.offset
        found_rows: Iterable[FoundRow] = (
            jsonl_from(file.path, fresh.offset, PASS_LIMIT)
            if file.fmt == "jsonl"
            else rows_from(file, 0)
        )
        for found in found_rows:
            last = found.offset
            failures = row_failures(found.row)
            if failures:
                self._add(
                    fresh,
                    file,
                    found.offset,
                    failures,
                    RETRY in found.row and bool(found.row[RETRY]),
                )
            if self._stop.is_set():
                break
        if file.fmt == "jsonl":
            fresh.offset = max(fresh.offset, _end_of(file, last, fresh.offset))
        with self._lock:
            self._progress[key] = fresh

    @staticmethod
    def _add(
        into: _FileProgress,
        file: RowFile,
        offset: int,
        failures: Mapping[str, str],
        retryable: bool,
    ) -> None:
        for sentence in failures.values():
            group = into.groups.setdefault(error_kind(sentence), Group())
            group.count += 1
            group.retryable += int(retryable)
            if not group.example:
                group.example = sentence
                group.where = (file.dataset, file.shard, file.where, offset)


def _end_of(file: RowFile, last: int, start: int) -> int:
    """The byte after the line at ``last`` (where the next pass reads on)."""
    if last < start:
        return start
    with open(file.path, "rb") as f:
        f.seek(last)
        line = f.readline()
    return last + len(line) if line.endswith(b"\n") else last
