"""The result journal: each (row, output) result written the moment it arrives.

Rows reach the part file a processing group at a time, and a checkpoint records them; a shard
killed mid-group would otherwise pay again for every row of that group. The journal closes the
gap: every successful result is appended here as it arrives (no fsync: it survives a killed
process, which is what resume is for), and a resumed run takes journaled results instead of
sending those requests again. Results that arrive together (in one turn of the event loop) go
out in one ``write``, at the end of that turn, before the loop reads more answers. Entries are
dropped once their rows are checkpointed; the file is rewritten from the live entries when it
grows, so it stays O(rows in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

import orjson

from mmirage.core.process.base import OutputResult
from mmirage.core.shard.disk import writing

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
JOURNAL_DIR = "loading_params.datasets[].output_dir"  # the journal sits in its .parts
_COMPACT_AT = 4096  # lines; rewrite when the file holds this many more than the live entries


class ResultJournal:
    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self._live: dict[str, dict[str, bytes]] = {}  # row key → output name → line
        self._lines = 0
        self._fd: int | None = None
        self._unwritten: list[bytes] = []  # lines of this turn of the event loop
        self._failure: BaseException | None = None  # of a write at the end of a turn

    def open(self) -> None:
        """Load what an interrupted run journaled (for this configuration only)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as f:
            for line in f:
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # the torn last line of a killed run
                if entry.get("fp") == self.fingerprint:
                    self._live.setdefault(entry["key"], {})[entry["output"]] = line
        self._rewrite()

    def get(self, key: str, output: str) -> OutputResult | None:
        entries = self._live.get(key)
        line = None if entries is None else entries.get(output)
        if line is None:
            return None
        entry = orjson.loads(line)
        return OutputResult(
            value=entry["value"],
            input_tokens=entry["input_tokens"],
            output_tokens=entry["output_tokens"],
        )

    def add(self, key: str, output: str, result: OutputResult) -> None:
        """Record a successful result (errors are not journaled: a resumed run retries them)."""
        if result.error is not None or self._fd is None:
            return
        entry: dict[str, Any] = {
            "fp": self.fingerprint,
            "key": key,
            "output": output,
            "value": result.value,
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
        }
        line = orjson.dumps(entry, default=str, option=_OPTS)
        self._raise_failure()
        self._unwritten.append(line)
        self._lines += 1
        self._live.setdefault(key, {})[output] = line
        if len(self._unwritten) == 1:
            try:
                asyncio.get_running_loop().call_soon(self._flush_at_end_of_turn)
            except RuntimeError:  # no event loop: nothing else can arrive in this turn
                self.flush()

    def flush(self) -> None:
        """Write the results added since the last write (and raise a failed write's error)."""
        self._raise_failure()
        if not self._unwritten or self._fd is None:
            return
        lines = b"".join(self._unwritten)
        self._unwritten.clear()
        with writing(self.path, JOURNAL_DIR):
            os.write(self._fd, lines)

    def _flush_at_end_of_turn(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # raised to the run by its next call here
            self._failure = exc

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def settle(self, keys: list[str]) -> None:
        """These rows are checkpointed: their entries are no longer needed."""
        self.flush()
        for key in keys:
            self._live.pop(key, None)
        if self._lines > _COMPACT_AT + 2 * sum(map(len, self._live.values())):
            self._rewrite()

    def close(self, *, remove: bool = False) -> None:
        with contextlib.suppress(Exception):  # a failure of its own was raised already
            self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if remove:
            self.path.unlink(missing_ok=True)

    def _rewrite(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        tmp = self.path.with_name(self.path.name + ".tmp")
        lines = [line for outputs in self._live.values() for line in outputs.values()]
        with writing(tmp, JOURNAL_DIR):
            tmp.write_bytes(b"".join(lines))
        os.replace(tmp, self.path)
        self._lines = len(lines)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
