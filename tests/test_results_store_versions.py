"""The results store across versions of a request: an edited config resubmits a changed request
under the same custom_id (a new *first* submission), and from then on only results of that
submission and of its retries count; the earlier version's answers are stale."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import orjson

from mmirage.core.process.batch.batch_records import (
    FAILED,
    MISSING,
    RUNNING,
    SUCCEEDED,
    BatchRecord,
)
from mmirage.core.process.batch.collector import scan_receipts
from mmirage.core.process.batch.results_store import ResultsStore
from test_batch_collector import err, ok

X, Y = "answer-text-3", "answer-text-4"
T1, T2, T3 = "2025-01-01T00:00:00", "2025-01-02T00:00:00", "2025-01-03T00:00:00"
T4 = "2025-01-04T00:00:00"


def submit(store: ResultsStore, batch_id: str, ids: list[str], at: str, **kw: Any) -> None:
    record = BatchRecord("openai", batch_id, submitted_at=at, request_count=len(ids))
    assert store.add_batch(record, ids, **kw)


def fetch(store: ResultsStore, batch_id: str, *rows: dict[str, Any]) -> None:
    store.store_results("openai", batch_id, rows, unanswered=(MISSING, f"{batch_id}: none"))


def states(store: ResultsStore, *ids: str) -> list[tuple[str, str | None]]:
    got = store.lookup(list(ids))
    return [(got[cid].state, got[cid].text) for cid in ids]


def failures(store: ResultsStore) -> list[tuple[str, str]]:
    return sorted((batch, cid) for _, batch, cid in store.failed_requests())


def test_an_edited_request_is_running_until_its_new_batch_is_back(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.sqlite") as store:
        submit(store, "b1", [X, Y], T1)
        fetch(store, "b1", ok(X, "A"), ok(Y, "A"))
        submit(store, "b2", [X], T2)  # X's request line changed: submitted again, same id
        assert states(store, X, Y) == [(RUNNING, None), (SUCCEEDED, "A")]
        assert failures(store) == []
        fetch(store, "b2", ok(X, "B"))
        assert states(store, X, Y) == [(SUCCEEDED, "B"), (SUCCEEDED, "A")]


def test_a_failed_new_version_wins_over_the_old_success(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.sqlite") as store:
        submit(store, "b1", [X, Y], T1)
        fetch(store, "b1", ok(X, "A"), ok(Y, "A"))
        submit(store, "b2", [X, Y], T2)
        fetch(store, "b2", err(X))  # and no result at all for Y
        got = store.lookup([X, Y])
        assert (got[X].state, got[X].text, got[X].message) == (FAILED, None, "boom")
        assert (got[Y].state, got[Y].message) == (MISSING, "b2: none")
        assert failures(store) == [("b2", X), ("b2", Y)]


def test_the_old_batch_fetched_after_the_new_one_changes_nothing(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.sqlite") as store:
        submit(store, "b1", [X, Y], T1)
        submit(store, "b2", [X, Y], T2)
        fetch(store, "b2", ok(X, "B"), err(Y))
        fetch(store, "b1", ok(X, "A"), ok(Y, "A"))  # a success of b1 would replace b2's before
        assert states(store, X, Y) == [(SUCCEEDED, "B"), (FAILED, None)]
        assert failures(store) == [("b2", Y)]


def test_the_old_batch_fetched_while_the_new_one_runs_stores_nothing(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.sqlite") as store:
        submit(store, "b1", [X], T1)
        submit(store, "b2", [X], T2)
        fetch(store, "b1", ok(X, "A"))
        assert states(store, X) == [(RUNNING, None)]
        fetch(store, "b2", err(X))
        assert states(store, X) == [(FAILED, None)]


def test_an_old_submission_scanned_after_the_new_one_changes_nothing(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.sqlite") as store:
        submit(store, "b2", [X], T2)
        submit(store, "b1", [X], T1)  # an older receipt read later
        fetch(store, "b1", ok(X, "A"))
        assert states(store, X) == [(RUNNING, None)]
        fetch(store, "b2", ok(X, "B"))
        assert states(store, X) == [(SUCCEEDED, "B")]


def test_retries_of_the_new_version_keep_the_success_over_failure_rule(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.sqlite") as store:
        submit(store, "b1", [X, Y], T1)
        fetch(store, "b1", ok(X, "A"), ok(Y, "A"))
        submit(store, "b2", [X, Y], T2)
        fetch(store, "b2", err(X), ok(Y, "B"))
        assert failures(store) == [("b2", X)]
        # retry resubmits X (and, say, Y again): the same version, so since stays at b2.
        submit(store, "b3", [X, Y], T3, resubmission=True)
        assert states(store, X, Y) == [(RUNNING, None), (SUCCEEDED, "B")]
        fetch(store, "b3", ok(X, "B3"), err(Y))
        assert states(store, X, Y) == [(SUCCEEDED, "B3"), (SUCCEEDED, "B")]  # no failure wins
        submit(store, "b4", [X], T4, resubmission=True)
        fetch(store, "b4", err(X))
        assert states(store, X) == [(SUCCEEDED, "B3")]
        assert failures(store) == []


def test_a_retry_of_the_old_version_before_the_edit_is_stale(tmp_path: Path) -> None:
    with ResultsStore(tmp_path / "results.sqlite") as store:
        submit(store, "b1", [X], T1)
        fetch(store, "b1", err(X))
        submit(store, "b2", [X], T2, resubmission=True)
        submit(store, "b3", [X], T3)  # the edit
        fetch(store, "b2", ok(X, "A"))
        assert states(store, X) == [(RUNNING, None)]
        assert failures(store) == []  # b1's failure is stale: nothing to retry
        fetch(store, "b3", ok(X, "B"))
        assert states(store, X) == [(SUCCEEDED, "B")]


def _old_store(path: Path) -> None:
    """A store as the release before ``requests.since`` made it, holding one fetched batch."""
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE batches (provider TEXT NOT NULL, batch_id TEXT NOT NULL,
            no INTEGER NOT NULL UNIQUE, processor TEXT, modality TEXT, spool_path TEXT,
            submitted_at TEXT NOT NULL DEFAULT '', request_count INTEGER NOT NULL DEFAULT 0,
            status TEXT, provider_status TEXT, fetched INTEGER NOT NULL DEFAULT 0,
            low INTEGER NOT NULL DEFAULT -1, high INTEGER NOT NULL DEFAULT -1,
            PRIMARY KEY (provider, batch_id)) WITHOUT ROWID;
        CREATE TABLE requests (source_index INTEGER NOT NULL, tag TEXT NOT NULL,
            batch_no INTEGER NOT NULL, PRIMARY KEY (source_index, tag)) WITHOUT ROWID;
        CREATE TABLE results (source_index INTEGER NOT NULL, tag TEXT NOT NULL,
            batch_no INTEGER NOT NULL, ok INTEGER NOT NULL, text TEXT, kind TEXT, message TEXT,
            retryable INTEGER, input_tokens INTEGER, output_tokens INTEGER, finish_reason TEXT,
            PRIMARY KEY (source_index, tag)) WITHOUT ROWID;
        INSERT INTO batches (provider, batch_id, no, submitted_at, request_count, fetched,
            low, high) VALUES ('openai', 'b1', 1, '2025-01-01T00:00:00', 2, 1, 3, 4);
        INSERT INTO requests VALUES (3, 'answer-text', 1), (4, 'answer-text', 1);
        INSERT INTO results (source_index, tag, batch_no, ok, text, kind, message, retryable)
            VALUES (3, 'answer-text', 1, 1, 'A', NULL, NULL, NULL),
                   (4, 'answer-text', 1, 0, NULL, 'server_error', 'boom', 1);
        """
    )
    db.commit()
    db.close()


def test_a_store_made_before_since_opens_and_behaves_as_before(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite"
    _old_store(path)
    with ResultsStore(path) as store:
        columns = {row[1]: row for row in store._db.execute("PRAGMA table_info(requests)")}
        assert "since" in columns
        assert store._db.execute("SELECT DISTINCT since FROM requests").fetchall() == [("",)]
        assert states(store, X, Y) == [(SUCCEEDED, "A"), (FAILED, None)]
        assert failures(store) == [("b1", Y)]
        submit(store, "b2", [Y], T2, resubmission=True)  # a retry, as before
        assert states(store, X, Y) == [(SUCCEEDED, "A"), (RUNNING, None)]
        fetch(store, "b2", ok(Y, "A2"))
        assert states(store, X, Y) == [(SUCCEEDED, "A"), (SUCCEEDED, "A2")]
    with ResultsStore(path) as store:  # reopening adds nothing twice
        submit(store, "b3", [X], T3)  # an edit from now on makes the old result stale
        assert states(store, X, Y) == [(RUNNING, None), (SUCCEEDED, "A2")]


def _receipt(batch_id: str, at: str, ids: list[str], **extra: Any) -> bytes:
    mapping = {cid: int(cid.rsplit("-", 1)[1]) for cid in ids}
    line = {
        "provider": "openai",
        "provider_batch_id": batch_id,
        "status": "submitted",
        "custom_id_to_source_index": mapping,
        "submitted_at_utc": at,
        **extra,
    }
    return orjson.dumps(line) + b"\n"


def test_scan_receipts_tells_a_retry_from_a_new_submission(tmp_path: Path) -> None:
    receipts = tmp_path / "batch_metadata.text.run.jsonl"
    receipts.write_bytes(
        _receipt("b1", T1, [X, Y])
        + _receipt("b2", T2, [X], retry_of=["b1"])
        + _receipt("b3", T3, [Y])
    )
    with ResultsStore(tmp_path / "results.sqlite") as store:
        scan_receipts([str(receipts)], store)
        since = dict(store._db.execute("SELECT source_index, since FROM requests"))
        assert since == {3: T1, 4: T3}  # the retry kept X's since; the edit moved Y's
