"""The answer store: every answer a shard paid for, kept for the life of the pipeline's state.

An answer is keyed by a digest of exactly what was asked (``request_keys``): the processor's
and output's settings that shape the request (provider, base URL, model, sampling, schema),
the row's key and its rendered prompt (or, for a ``custom`` output, its inputs). Before a
request leaves, the store is asked: a resumed run, ``retry``, ``--force-retry`` and a
recomputation after a config edit take what was bought instead of buying it again; an output
whose request changed (its prompt, model or sampling was edited) misses and is asked anew.
Two rows with the same prompt are two requests: the row's key is in the digest.

Two files per shard under ``<pipeline dir>/answers/``:

* ``<shard>.log`` — this run's answers, appended as they arrive (one line each, written at
  the end of the event loop's turn, no fsync: it survives a killed process, which is what it
  is for). A line is ``<32 hex digest>\\t<JSON list>``; the list is ``[row key, output, value,
  input tokens, output tokens, finish_reason]``, with ``error, kind`` after it for a failure
  that was paid for and would come back the same (a truncated or invalid answer, a refusal).
* ``<shard>.sqlite`` — the index lookups read: when a run opens the store, the log is folded
  into it (one transaction) and emptied. Memory stays flat however many answers there are.

A torn last line (a process killed mid-write) is left out; a damaged index is set aside with
one WARNING and its answers are asked again: nothing half-written is trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from collections.abc import Iterable, Iterator
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

from mmirage.core.process.base import OutputResult
from mmirage.core.shard.disk import DiskFullError, disk_full_message, write_error, writing
from mmirage.errors import WorkFailed

logger = logging.getLogger(__name__)

_OPTS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
STORE_DIR = "loading_params.state_dir"  # what chose the disk of these files
_DIGEST_HEX = 32  # a 16-byte BLAKE2b digest
_FOLD_LINES = 50_000  # log lines folded per executemany: memory stays bounded
_LOOKUP_CHUNK = 500  # digests per query (well under SQLite's parameter limit)


def keeps(result: OutputResult) -> bool:
    """Whether the store keeps ``result``: an answer; or a failure that was paid for and
    would come back the same (a truncated or invalid answer, a refusal), never a transient
    one (a rate limit, a server error, a timeout) nor a fallback."""
    if result.error is None:
        return True
    paid = result.input_tokens or result.output_tokens
    return bool(paid) and not result.retryable and not result.fallback


class AnswerStore:
    """One shard's stored answers: ``open`` it, ``find`` before asking, ``add`` what came."""

    def __init__(self, folder: Path, name: str) -> None:
        self.log_path = folder / f"{name}.log"
        self.index_path = folder / f"{name}.sqlite"
        self._db: sqlite3.Connection | None = None
        self._fd: int | None = None
        self._unwritten = bytearray()  # lines of this turn of the event loop
        self._failure: BaseException | None = None  # of a write at the end of a turn
        # Whether a lookup can find anything: the index has answers and this is no --fresh run.
        self.lookups = False
        # Results handed in for this run only (``pin``): a failed row's kept outputs.
        self._pinned: dict[tuple[str, str], OutputResult] = {}
        self.reused = 0  # answers taken from the store (or pinned) instead of asked
        self.asked = 0  # requests sent for lack of a stored answer (counted by the runner)

    # -- opening -------------------------------------------------------------------------

    def open(self, *, fresh: bool = False) -> None:
        """Fold what earlier runs logged into the index, for this run's lookups. ``fresh``
        (``--fresh``): the store goes aside whole, unread, as the store
        ``<shard>.before-fresh`` (its log and index), and this run finds nothing; what it asks
        is all a resumed run will find. A first run (nothing stored) opens no index."""
        with writing(self.log_path.parent, STORE_DIR):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            if fresh:
                self._set_aside_for_fresh()
        if _size(self.log_path) or self.index_path.exists():
            self._db = self._connect()
            try:
                self._fold()
                self.lookups = (
                    self._db.execute("SELECT 1 FROM answers LIMIT 1").fetchone() is not None
                )
            except sqlite3.DatabaseError as exc:
                self._set_aside(exc)
        with writing(self.log_path, STORE_DIR):
            _cut_torn_tail(self.log_path)  # else the next line would be glued to it
            self._fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _connect(self) -> sqlite3.Connection:
        try:
            db = self._schema(sqlite3.connect(self.index_path, isolation_level=None))
        except sqlite3.DatabaseError as exc:
            return self._set_aside(exc)
        return db

    @staticmethod
    def _schema(db: sqlite3.Connection) -> sqlite3.Connection:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: a killed process loses no commit
        db.execute(
            "CREATE TABLE IF NOT EXISTS answers (digest BLOB PRIMARY KEY, entry BLOB NOT NULL)"
            " WITHOUT ROWID"
        )
        return db

    def _set_aside(self, exc: sqlite3.DatabaseError) -> sqlite3.Connection:
        """A damaged index goes aside (kept for a look, never read again) for an empty one.
        A failure of the disk under it (full, unreadable) is no damage: it is raised."""
        if isinstance(exc, sqlite3.OperationalError):
            if "full" in str(exc):
                raise DiskFullError(disk_full_message(self.index_path, STORE_DIR)) from exc
            raise WorkFailed(
                f"answer store {self.index_path} cannot be used ({exc}); check that disk, then "
                "run again (the shard resumes from its last checkpoint)"
            ) from exc
        logger.warning(
            "answer store %s is damaged (%s): it is set aside as %s.damaged, and the answers "
            "it held will be asked again",
            self.index_path,
            exc,
            self.index_path.name,
        )
        self._move_index(self.index_path.with_name(self.index_path.name + ".damaged"))
        self._db = self._schema(sqlite3.connect(self.index_path, isolation_level=None))
        return self._db

    def _set_aside_for_fresh(self) -> None:
        """Every file of the store to ``<shard>.before-fresh.*``, replacing an earlier set
        whole (a log of one generation is never folded into the index of another)."""
        stem = self.log_path.with_suffix("")
        pairs = [(Path(f"{self.index_path}{x}"), "sqlite" + x) for x in ("", "-wal", "-shm")]
        pairs.append((self.log_path, "log"))
        for _, ending in pairs:
            Path(f"{stem}.before-fresh.{ending}").unlink(missing_ok=True)
        for path, ending in pairs:
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, f"{stem}.before-fresh.{ending}")

    def _move_index(self, aside: Path) -> None:
        """Close the index and move its files to ``aside`` (replacing what is there)."""
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.index_path}{suffix}", f"{aside}{suffix}")

    def _fold(self) -> None:
        """The log's whole lines into the index, then an empty log. A crash in between folds
        the same lines again next time: they replace themselves."""
        assert self._db is not None
        if not _size(self.log_path):
            return
        bad = 0
        with open(self.log_path, "rb") as f:
            db = self._db
            db.execute("BEGIN")
            try:
                entries = _entries(f)
                while chunk := list(islice(entries, _FOLD_LINES)):
                    pairs = [pair for pair in chunk if pair is not None]
                    bad += len(chunk) - len(pairs)
                    # By digest: a B-tree fills fastest in order. Stable: a later line wins.
                    pairs.sort(key=itemgetter(0))
                    db.executemany("INSERT OR REPLACE INTO answers VALUES (?, ?)", pairs)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # SQLite rolls back by itself on a full disk
                    db.execute("ROLLBACK")
                raise
        if bad:
            logger.warning(
                "answer store %s: %d line(s) cut short by an interrupted write are left out; "
                "those answers will be asked again",
                self.log_path,
                bad,
            )
        # The folded answers into the index file itself: the write-ahead log shrinks to 0.
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        with writing(self.log_path, STORE_DIR):
            os.truncate(self.log_path, 0)

    # -- reading -------------------------------------------------------------------------

    def pin(self, key: str, output: str, result: OutputResult) -> None:
        """Hand in ``result`` for (row, output) for this run: found whatever the digest
        (``mmirage retry`` pins the outputs a failed row kept in its marker)."""
        self._pinned[(key, output)] = result
        self.lookups = True

    def find(
        self, output: str, keys: list[str], digests: list[bytes] | None
    ) -> dict[int, OutputResult]:
        """The stored results among these requests, by their position (``digests`` None:
        an output whose answers are not stored, only pinned results)."""
        found: dict[int, OutputResult] = {}
        pinned = self._pinned
        if pinned:
            for at, key in enumerate(keys):
                result = pinned.pop((key, output), None)
                if result is not None:
                    found[at] = result
        if digests is not None:
            wanted = {d: at for at, d in enumerate(digests) if at not in found}
            for digest, result in self.stored(list(wanted)):
                found[wanted[digest]] = result
        self.reused += len(found)
        return found

    def stored(self, digests: list[bytes]) -> Iterator[tuple[bytes, OutputResult]]:
        """What the index holds under these digests (nothing on a first or --fresh run)."""
        if self._db is None or not self.lookups:
            return
        for digest, entry in self._select(digests):
            result = _result(entry)
            if result is not None:
                yield digest, result

    def _select(self, digests: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        assert self._db is not None
        for start in range(0, len(digests), _LOOKUP_CHUNK):
            chunk = digests[start : start + _LOOKUP_CHUNK]
            marks = ",".join("?" * len(chunk))
            try:
                yield from self._db.execute(
                    f"SELECT digest, entry FROM answers WHERE digest IN ({marks})", chunk
                )
            except sqlite3.DatabaseError as exc:  # damaged since it opened: ask again
                self._set_aside(exc)
                self.lookups = False
                return

    # -- writing -------------------------------------------------------------------------

    def add_answer(
        self,
        digest: bytes,
        key: str,
        output: str,
        value: Any,
        input_tokens: int,
        output_tokens: int,
    ) -> None:
        """Store a plain successful answer (written at the end of this turn of the event loop)."""
        self._append(digest, [key, output, value, input_tokens, output_tokens, None])

    def add(self, digest: bytes, key: str, output: str, result: OutputResult) -> None:
        """Store ``result``: an answer, or a failure that was paid for and would come back the
        same if asked again (the caller decides which failures those are)."""
        entry = [key, output, result.value, result.input_tokens, result.output_tokens]
        entry.append(result.finish_reason)
        if result.error is not None:
            entry += [result.error, result.kind]
        self._append(digest, entry)

    def _append(self, digest: bytes, entry: list[Any]) -> None:
        if self._fd is None:
            return
        if self._failure is not None:
            self._raise_failure()
        unwritten = self._unwritten
        first = not unwritten
        unwritten += digest.hex().encode()
        unwritten += b"\t"
        unwritten += orjson.dumps(entry, default=str, option=_OPTS)
        unwritten += b"\n"
        if first:
            try:
                asyncio.get_running_loop().call_soon(self._flush_at_end_of_turn)
            except RuntimeError:  # no event loop: nothing else can arrive in this turn
                self.flush()

    def flush(self) -> None:
        """Write the answers added since the last write (and raise a failed write's error)."""
        if self._failure is not None:
            self._raise_failure()
        if not self._unwritten or self._fd is None:
            return
        lines, self._unwritten = self._unwritten, bytearray()
        try:  # once per turn of the event loop: no context manager (``writing``) here
            written = os.write(self._fd, lines)
            while written < len(lines):  # a short write (a nearly full disk): the rest too
                written += os.write(self._fd, memoryview(lines)[written:])
        except OSError as exc:
            raise write_error(exc, self.log_path, STORE_DIR)  # noqa: B904 - its cause is set

    def _flush_at_end_of_turn(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # raised to the run by its next call here
            self._failure = exc

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def close(self) -> None:
        try:
            self.flush()
        except Exception as exc:  # on the way out (a stop, a failure): said, not raised
            logger.warning(
                "answer store %s: its last answers were not kept: %s", self.log_path, exc
            )
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None

    def summary(self) -> str | None:
        """One line for the shard's report: answers reused and requests sent, if any."""
        if not (self.reused or self.asked):
            return None
        return f"{self.reused} answer(s) reused from the answer store, {self.asked} request(s) sent"

    def __enter__(self) -> AnswerStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut_torn_tail(path: Path) -> None:
    """Cut a line a killed process left half-written at the log's end (its answer is lost:
    asked again)."""
    size = _size(path)
    if not size:
        return
    with open(path, "rb+") as f:
        f.seek(max(0, size - (1 << 16)))
        tail = f.read()
        if tail.endswith(b"\n"):
            return
        end = tail.rfind(b"\n")
        if end < 0 and size > len(tail):
            return  # a line longer than the window: the fold leaves it out
        f.truncate(size - len(tail) + end + 1)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _entries(lines: Iterable[bytes]) -> Iterator[tuple[bytes, bytes] | None]:
    """(digest, entry) per whole log line; ``None`` for a line cut short."""
    for line in lines:
        if (
            not line.endswith(b"\n")
            or len(line) < _DIGEST_HEX + 3
            or line[_DIGEST_HEX : _DIGEST_HEX + 1] != b"\t"
        ):
            yield None
            continue
        try:
            digest = bytes.fromhex(line[:_DIGEST_HEX].decode("ascii"))
        except ValueError:
            yield None
            continue
        yield digest, line[_DIGEST_HEX + 1 : -1]


def _result(entry: bytes) -> OutputResult | None:
    """A stored entry as the result it was; ``None`` for one that cannot be read (asked
    again: nothing is guessed)."""
    try:
        _, _, value, input_tokens, output_tokens, finish_reason, *failure = orjson.loads(entry)
    except (orjson.JSONDecodeError, ValueError, TypeError):
        return None
    result = OutputResult(value, None, False, False, input_tokens, output_tokens, finish_reason)
    if failure:
        result.error, result.kind = failure[0], failure[1] if len(failure) > 1 else None
    return result


__all__ = ["AnswerStore", "keeps"]
