"""The results store: every batch result ever fetched, in ``<state>/batch/results.sqlite``.

Why a store rather than downloading on every merge: a provider batch is paid for once and its
results are downloaded once (a terminal batch never changes); the store remembers which batches
were fetched, so a second ``merge`` (or one after ``retry``) downloads only the new batches.
It also keeps merge O(1) in rows: each group of dataset rows looks its results up here instead
of a million results sitting in a dict.

Three tables (stdlib ``sqlite3``, writes in ``executemany`` batches of ``WRITE_BATCH``):

* ``batches`` — one line per (provider, batch id) seen in a receipt: a small number ``no``,
  where its request lines are (``spool_path``, for ``retry``), its last known status, whether
  it was fetched, and the span of row numbers it holds;
* ``requests`` — each request → the batch of its *latest* submission (a ``retry`` receipt is
  newer than the first one, so it wins) and ``since``, the time of its latest *first*
  (non-retry) submission: an edited config resubmits a changed request under the same id;
* ``results`` — each request → its latest outcome. A success is never replaced by a failure;
  a later success replaces an earlier one, a later failure an earlier failure ("merge takes the
  latest success per row"). A result of a batch submitted before ``since`` answers an earlier
  version of the request: *stale*, it never counts (SQL in ``results_sql``; ``lookup`` drops
  one in Python, from the batch times it holds).

A request is keyed by ``(source_index, tag)``, its custom_id ``<tag>-<source_index>`` split
(``tag`` = ``<output>-<modality>``): rows are read in source order and chunks hold neighbouring
rows, so lookups and inserts walk the B-trees in order (several times faster than text keys
spread over the whole tree). An id of another shape is kept whole as the tag, with index -1.

Outcomes are reported as one of ``OUTCOMES``: ``succeeded``, ``failed`` (the provider failed the
request, or the whole batch), ``expired``, ``canceled``, ``missing`` (a terminal batch that holds
no result for it, or no receipt names it) and ``running`` (its latest batch is not done yet).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import chain, islice
from pathlib import Path
from typing import Any

from mmirage.core.process.batch.batch_records import (
    CANCELED,
    EXPIRED,
    FAILED,
    MISSING,
    OUTCOMES,
    RUNNING,
    SUCCEEDED,
    BatchRecord,
    RequestOutcome,
    failure_state,
    join_id,
    result_line,
    split_id,
)
from mmirage.core.process.batch.results_sql import (
    ADDED_COLUMNS,
    FAILED_REQUESTS,
    LINES_PER_UPSERT,
    MARK_UNANSWERED,
    OUTCOME_LINES,
    SCHEMA,
    UPSERT_CURRENT_RESULT,
    UPSERT_CURRENT_RESULTS,
    UPSERT_REQUEST,
    UPSERT_RESULT,
)

# Kept importable; renamed apart from llm_kit.providers.batch_backend.Outcome.
Outcome = RequestOutcome
WRITE_BATCH = 5000
_IN_BATCH = 900  # bound variables per query, under every SQLite build's limit


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


class ResultsStore:
    """One sqlite file; use as a context manager (or call ``close``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=60)
        # WAL: a reader (check) never blocks on a writer (merge); a bounded page cache keeps a
        # million-result store from growing the process.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA cache_size=-65536")
        self._db.executescript(SCHEMA)
        self._add_columns()
        self._batches: dict[tuple[str, str], BatchRecord] = {}
        self._numbers: dict[tuple[str, str], int] = {}
        self._by_number: dict[int, tuple[str, str]] = {}
        self._spans: dict[int, tuple[int, int]] = {}
        self._at: dict[int, str] = {}  # batch number → submitted_at: stale checks in Python
        self._read_batches()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def _add_columns(self) -> None:
        """Bring a store made by an older mmirage up to ``ADDED_COLUMNS``."""
        for table, columns in ADDED_COLUMNS.items():
            have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns:
                if name not in have:
                    with self._db:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    # -- batches ---------------------------------------------------------------------------

    def _read_batches(self) -> None:
        cursor = self._db.execute(
            "SELECT provider, batch_id, processor, modality, spool_path, submitted_at, "
            "request_count, status, provider_status, fetched, no, low, high FROM batches"
        )
        for (
            provider,
            batch_id,
            proc,
            modality,
            spool,
            at,
            count,
            status,
            word,
            done,
            *more,
        ) in cursor:
            record = BatchRecord(
                provider, batch_id, proc, modality, spool, at, count, status, word, bool(done)
            )
            self._remember(record, more[0], (more[1], more[2]))

    def _remember(self, record: BatchRecord, no: int, span: tuple[int, int]) -> None:
        self._batches[record.key] = record
        self._numbers[record.key] = no
        self._by_number[no] = record.key
        self._spans[no] = span
        self._at[no] = record.submitted_at

    def batch(self, provider: str, batch_id: str) -> BatchRecord | None:
        return self._batches.get((provider, batch_id))

    def batches(self) -> list[BatchRecord]:
        return list(self._batches.values())

    def add_batch(
        self, record: BatchRecord, custom_ids: Iterable[str], *, resubmission: bool = False
    ) -> bool:
        """Record a submitted batch and its requests; ``False`` (nothing done) if known.
        ``resubmission``: a ``retry`` of failed requests (same request lines), which keeps
        their ``since``; any other batch is a first submission, which moves it."""
        if record.key in self._batches:
            return False
        no = len(self._numbers) + 1
        low, high = -1, -1
        at, again = record.submitted_at, int(resubmission)  # ?5: the time the row below gets
        with self._db:
            self._db.execute(
                "INSERT INTO batches (provider, batch_id, no, processor, modality, spool_path, "
                "submitted_at, request_count) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.provider,
                    record.batch_id,
                    no,
                    record.processor,
                    record.modality,
                    record.spool_path,
                    record.submitted_at,
                    record.request_count,
                ),
            )
            for chunk in _chunks(custom_ids, WRITE_BATCH):
                keys = sorted(split_id(cid) for cid in chunk)
                self._db.executemany(UPSERT_REQUEST, [(i, tag, no, again, at) for i, tag in keys])
                low = keys[0][0] if low == -1 else min(low, keys[0][0])
                high = max(high, keys[-1][0])
            self._db.execute(
                "UPDATE batches SET low = ?, high = ? WHERE no = ?", (min(low, high), high, no)
            )
        self._remember(record, no, (min(low, high), high))
        return True

    def set_status(
        self, provider: str, batch_id: str, status: str, provider_status: str | None
    ) -> None:
        with self._db:
            self._db.execute(
                "UPDATE batches SET status = ?, provider_status = ? WHERE no = ?",
                (status, provider_status, self._numbers[(provider, batch_id)]),
            )
        record = self._batches[(provider, batch_id)]
        self._batches[record.key] = replace(record, status=status, provider_status=provider_status)

    # -- results ---------------------------------------------------------------------------

    def store_results(
        self,
        provider: str,
        batch_id: str,
        rows: Iterable[Mapping[str, Any]],
        *,
        unanswered: tuple[str, str],
    ) -> int:
        """Store a terminal batch's result rows, record ``unanswered`` (kind, message) for its
        requests that got none, and mark it fetched — all in one transaction, so an
        interrupted download is simply done again. Returns how many rows were stored."""
        no = self._numbers[(provider, batch_id)]
        later = self._later_spans(no)
        stored = 0
        with self._db:
            for chunk in _chunks(rows, WRITE_BATCH):
                lines = sorted(line for row in chunk if (line := result_line(no, row)))
                if not lines:
                    continue
                low, high = lines[0][0], lines[-1][0]
                if any(lo <= high and low <= hi for lo, hi in later):  # some may be stale
                    self._db.executemany(UPSERT_RESULT, lines)
                else:
                    self._upsert_current(lines)
                stored += len(lines)
            low, high = self._spans[no]
            self._db.execute(MARK_UNANSWERED, (*unanswered, low, high, no))
            self._db.execute("UPDATE batches SET fetched = 1 WHERE no = ?", (no,))
        record = self._batches[(provider, batch_id)]
        self._batches[record.key] = replace(record, fetched=True)
        return stored

    def _upsert_current(self, lines: list[tuple[Any, ...]]) -> None:
        """Lines that cannot be stale, in order: ``LINES_PER_UPSERT`` a statement, the rest
        one by one (binding a line costs less than running a statement)."""
        whole = len(lines) - len(lines) % LINES_PER_UPSERT
        groups = (lines[i : i + LINES_PER_UPSERT] for i in range(0, whole, LINES_PER_UPSERT))
        self._db.executemany(UPSERT_CURRENT_RESULTS, (tuple(chain(*g)) for g in groups))
        self._db.executemany(UPSERT_CURRENT_RESULT, lines[whole:])

    def _later_spans(self, no: int) -> list[tuple[int, int]]:
        """The row spans of the batches submitted after batch ``no``. A request's ``since`` is
        the time of a batch holding it (or ''), so a result of batch ``no`` whose row is in
        none of these spans cannot be stale: it is stored without the per-row check."""
        at = self._at[no]
        return [self._spans[n] for n, later in self._at.items() if later > at]

    def lookup(self, custom_ids: Sequence[str]) -> dict[str, RequestOutcome]:
        """The latest outcome of each id (every id gets one)."""
        wanted = {split_id(cid): cid for cid in custom_ids}
        found: dict[str, RequestOutcome] = {}
        for line in self._outcome_lines(sorted({i for i, _ in wanted})):
            cid = wanted.get((line[0], line[1]))
            if cid is not None:
                found[cid] = self._outcome(cid, line)
        if len(found) < len(wanted):  # ids are distinct keys: all found when as many
            for cid in custom_ids:
                if cid not in found:
                    found[cid] = RequestOutcome(
                        cid, MISSING, message="no batch receipt names this request"
                    )
        return found

    def _outcome_lines(self, indices: list[int]) -> Iterable[tuple[Any, ...]]:
        """The requests of these row numbers with their results: one range scan when they are
        dense (rows read in order; its cursor as it is: no step of ours per line), else
        lookups ``_IN_BATCH`` numbers at a time."""
        if not indices:
            return ()
        if indices[-1] - indices[0] < 4 * len(indices) + 16:
            sql = OUTCOME_LINES.format(where="BETWEEN ? AND ?")
            return self._db.execute(sql, (indices[0], indices[-1]))
        return self._sparse_outcome_lines(indices)

    def _sparse_outcome_lines(self, indices: list[int]) -> Iterator[tuple[Any, ...]]:
        for chunk in _chunks(indices, _IN_BATCH):
            sql = OUTCOME_LINES.format(where=f"IN ({','.join('?' * len(chunk))})")
            yield from self._db.execute(sql, chunk)

    def _outcome(self, cid: str, line: tuple[Any, ...]) -> RequestOutcome:
        _, _, latest, since, result_no, ok, text, kind, message, retryable, tin, tout, finish = line
        if result_no is not None:
            at = self._at.get(result_no)
            if at is None or at < since:  # stale (see results_sql): as if there were none
                result_no = ok = None
        if ok:
            return RequestOutcome(
                cid, SUCCEEDED, text, input_tokens=tin, output_tokens=tout, finish_reason=finish
            )
        latest_key = self._by_number.get(latest)
        latest_done = latest_key is None or self._batches[latest_key].fetched
        if result_no is not None and (latest_done or latest == result_no):
            return RequestOutcome(
                cid,
                failure_state(kind),
                message=message,
                retryable=None if retryable is None else bool(retryable),
                input_tokens=tin,
                output_tokens=tout,
                finish_reason=finish,
            )
        if latest_done:
            batch = latest_key[1] if latest_key else "?"
            return RequestOutcome(cid, MISSING, message=f"batch {batch} returned no result for it")
        return RequestOutcome(cid, RUNNING)

    def failed_requests(self, *, only_retryable: bool = False) -> Iterator[tuple[str, str, str]]:
        """``(provider, batch_id, custom_id)`` of every request whose latest outcome is a
        failure of a finished batch, grouped by batch (streamed: a million failures never sit
        in memory at once). Requests still running are never listed."""
        cursor = self._db.execute(FAILED_REQUESTS)
        for batch_no, source_index, tag, retryable in cursor:
            key = self._by_number.get(batch_no)
            if key is None or not self._batches[key].fetched:
                continue  # resubmitted and not back yet
            if only_retryable and retryable == 0:
                continue
            yield key[0], key[1], join_id(source_index, tag)


__all__ = [
    "CANCELED",
    "EXPIRED",
    "FAILED",
    "MISSING",
    "OUTCOMES",
    "RUNNING",
    "SUCCEEDED",
    "BatchRecord",
    "Outcome",
    "RequestOutcome",
    "ResultsStore",
    "failure_state",
    "join_id",
    "split_id",
]
