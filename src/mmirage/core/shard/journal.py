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
from mmirage.core.shard.disk import write_error, writing

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
JOURNAL_DIR = "loading_params.datasets[].output_dir"  # the journal sits in its .parts
_COMPACT_AT = 4096  # lines; rewrite when the file holds this many more than the live entries


class ResultJournal:
    """File format: a header line ``{"fp": <configuration>}``, then one line per result,
    ``[row key, output, value, input tokens, output tokens]`` (a list: no dict to build for
    each answer). Lines under another configuration's header are ignored."""

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path = path
        self.fingerprint = fingerprint
        self._header = orjson.dumps({"fp": fingerprint}, option=orjson.OPT_APPEND_NEWLINE)
        # output -> row key -> (row key, output, value, tokens in, out): the entries not
        # checkpointed yet, what a compaction rewrites.
        self._live: dict[str, dict[str, tuple[Any, ...]]] = {}
        self._lines = 0
        self._fd: int | None = None
        self._unwritten = bytearray()  # lines of this turn of the event loop
        self._failure: BaseException | None = None  # of a write at the end of a turn
        # Whether a row may find its answer here: an interrupted run's, or one ``replay`` put
        # in (what this run journals itself is never asked for again).
        self.replays = False

    def open(self) -> None:
        """Load what an interrupted run journaled (for this configuration only)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ours = False
        with contextlib.suppress(FileNotFoundError), open(self.path, "rb") as f:
            for line in f:
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # the torn last line of a killed run
                if isinstance(entry, dict) and "key" in entry:  # one line of an older format
                    if entry.get("fp") == self.fingerprint:
                        fields = ("key", "output", "value", "input_tokens", "output_tokens")
                        self._keep(tuple(entry[k] for k in fields))
                elif isinstance(entry, dict):
                    ours = entry.get("fp") == self.fingerprint
                elif ours and isinstance(entry, list) and len(entry) == 5:
                    self._keep(tuple(entry))
        self.replays = any(self._live.values())
        self._rewrite()

    def _keep(self, entry: tuple[Any, ...]) -> None:
        self._live.setdefault(entry[1], {})[entry[0]] = entry

    def get(self, key: str, output: str) -> OutputResult | None:
        entry = self._live.get(output, {}).get(key)
        if entry is None:
            return None
        _, _, value, input_tokens, output_tokens = entry
        return OutputResult(value=value, input_tokens=input_tokens, output_tokens=output_tokens)

    def replay(self, key: str, output: str, result: OutputResult) -> None:
        """Journal ``result`` as an interrupted run would have: the next computation of that
        row takes it instead of asking for it (``mmirage retry`` puts the outputs a failed row
        kept here)."""
        self.add(key, output, result)
        self.replays = True

    def add(self, key: str, output: str, result: OutputResult) -> None:
        """Record a successful result (errors are not journaled: a resumed run retries them)."""
        if result.error is None:
            self.add_answer(key, output, result.value, result.input_tokens, result.output_tokens)

    def add_answer(
        self, key: str, output: str, value: Any, input_tokens: int, output_tokens: int
    ) -> None:
        """Record a successful result given by its parts."""
        if self._fd is None:
            return
        if self._failure is not None:
            self._raise_failure()
        entry = (key, output, value, input_tokens, output_tokens)
        unwritten = self._unwritten
        first = not unwritten
        # Straight into the turn's buffer: orjson's output kept alive costs several times
        # its making.
        unwritten += orjson.dumps(entry, default=str, option=_OPTS)
        live = self._live.get(output)
        if live is None:
            live = self._live[output] = {}
        live[key] = entry
        if first:
            try:
                asyncio.get_running_loop().call_soon(self._flush_at_end_of_turn)
            except RuntimeError:  # no event loop: nothing else can arrive in this turn
                self.flush()

    def flush(self) -> None:
        """Write the results added since the last write (and raise a failed write's error)."""
        if self._failure is not None:
            self._raise_failure()
        if not self._unwritten or self._fd is None:
            return
        lines, self._unwritten = self._unwritten, bytearray()
        self._lines += lines.count(b"\n")  # an entry is one line (JSON escapes its newlines)
        try:  # once per turn of the event loop: no context manager (``writing``) here
            os.write(self._fd, lines)
        except OSError as exc:
            raise write_error(exc, self.path, JOURNAL_DIR)  # noqa: B904 - its cause is set

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
        live = 0
        for entries in self._live.values():
            pop = entries.pop
            for key in keys:
                pop(key, None)
            live += len(entries)
        if self._lines > _COMPACT_AT + 2 * live:
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
        lines = bytearray(self._header)
        for entries in self._live.values():
            for entry in entries.values():
                lines += orjson.dumps(entry, default=str, option=_OPTS)
        with writing(tmp, JOURNAL_DIR):
            tmp.write_bytes(lines)
        os.replace(tmp, self.path)
        self._lines = sum(len(entries) for entries in self._live.values())
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
