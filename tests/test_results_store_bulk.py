"""The results store's fast paths give what its one-line-at-a-time, checked path gives: many
lines a statement (with repeated ids in one download), and the stale check done in Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mmirage.core.process.batch.batch_records import MISSING, BatchRecord
from mmirage.core.process.batch.results_sql import LINES_PER_UPSERT
from mmirage.core.process.batch.results_store import ResultsStore
from test_batch_collector import err, ok

T1, T2 = "2025-01-01T00:00:00", "2025-01-02T00:00:00"
IDS = [f"answer-text-{i}" for i in range(2 * LINES_PER_UPSERT + 7)]  # whole groups and a rest


def _rows() -> list[dict[str, Any]]:
    """One download: each id once, some twice (a failure then a success, a success then a
    failure, two successes), some only failed."""
    rows: list[dict[str, Any]] = []
    for n, cid in enumerate(IDS):
        if n % 5 == 0:
            rows += [err(cid), ok(cid, f"late {n}")]
        elif n % 5 == 1:
            rows += [ok(cid, f"early {n}", input_tokens=n, output_tokens=1), err(cid)]
        elif n % 5 == 2:
            rows += [ok(cid, f"a {n}"), ok(cid, f"b {n}", finish_reason="stop")]
        elif n % 5 == 3:
            rows.append(err(cid, retryable=n % 2 == 0))
        else:
            rows.append(ok(cid, f"only {n}"))
    return rows


def _outcomes(path: Path, *, later_batch: bool) -> dict[str, tuple[Any, ...]]:
    """b1's download stored, then every id looked up. ``later_batch``: a batch submitted
    after b1 holds a request of another output in b1's rows, so b1's lines go through the
    per-line stale check; without it, through the fast path."""
    with ResultsStore(path) as store:
        store.add_batch(BatchRecord("openai", "b1", submitted_at=T1), IDS)
        if later_batch:
            store.add_batch(BatchRecord("openai", "b2", submitted_at=T2), ["facts-text-3"])
        store.store_results("openai", "b1", _rows(), unanswered=(MISSING, "none"))
        got = store.lookup(IDS)
    return {
        cid: (o.state, o.text, o.message, o.retryable, o.input_tokens, o.finish_reason)
        for cid, o in got.items()
    }


def test_the_fast_path_stores_what_the_checked_path_stores(tmp_path: Path) -> None:
    fast = _outcomes(tmp_path / "fast.sqlite", later_batch=False)
    checked = _outcomes(tmp_path / "checked.sqlite", later_batch=True)
    assert fast == checked
    assert fast["answer-text-0"][:2] == ("succeeded", "late 0")  # a success after a failure
    assert fast["answer-text-1"][:2] == ("succeeded", "early 1")  # never a failure over it
    assert fast["answer-text-2"][:2] == ("succeeded", "b 2")  # the later success
    assert fast["answer-text-3"][0] == "failed"
    assert fast["answer-text-4"][:2] == ("succeeded", "only 4")


def test_a_stored_result_goes_stale_when_its_request_is_submitted_again(tmp_path: Path) -> None:
    """b1's answer is stored, then the request changes and goes out again (b2): the lookup
    (its stale check is done in Python) no longer counts b1's answer, and b2 is running."""
    cid = IDS[0]
    with ResultsStore(tmp_path / "results.sqlite") as store:
        store.add_batch(BatchRecord("openai", "b1", submitted_at=T1), [cid])
        store.store_results("openai", "b1", [ok(cid, "old")], unanswered=(MISSING, "none"))
        assert store.lookup([cid])[cid].text == "old"
        store.add_batch(BatchRecord("openai", "b2", submitted_at=T2), [cid])
        assert store.lookup([cid])[cid].state == "running"
        store.store_results("openai", "b2", [err(cid)], unanswered=(MISSING, "none"))
        got = store.lookup([cid])[cid]
        assert (got.state, got.text) == ("failed", None)  # b1's success is stale: not kept
