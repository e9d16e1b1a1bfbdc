"""The answer store's files: answers logged as they arrive, folded into the index by the next
run, found by the digest of exactly what was asked; a torn line or a damaged index is never
trusted."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from mmirage.core.process.base import OutputResult
from mmirage.core.shard.answers import AnswerStore
from mmirage.core.shard.request_keys import request_digest, request_identity

IDENTITY = request_identity({"model": "m"})


def digest(key: str, prompt: str = "p", identity: bytes = IDENTITY) -> bytes:
    return request_digest(identity, key, prompt)


def opened(folder: Path, *, fresh: bool = False, name: str = "shard-0-of-1") -> AnswerStore:
    store = AnswerStore(folder, name)
    store.open(fresh=fresh)
    return store


def test_answers_come_back_by_what_was_asked(tmp_path: Path) -> None:
    with opened(tmp_path) as store:
        assert not store.lookups  # nothing stored yet: no lookups on the hot path
        store.add_answer(digest("0::1"), "0::1", "answer", {"n": 1}, 3, 4)
        cut = OutputResult(error="cut at max_tokens", input_tokens=5, output_tokens=9)
        cut.kind, cut.finish_reason = "truncated", "length"
        store.add(digest("0::2"), "0::2", "answer", cut)
    with opened(tmp_path) as store:
        assert store.lookups
        keys = ["0::1", "0::2", "0::3"]
        found = store.find("answer", keys, [digest(k) for k in keys])
        assert found[0] == OutputResult(value={"n": 1}, input_tokens=3, output_tokens=4)
        assert found[1].error == "cut at max_tokens" and found[1].kind == "truncated"
        assert found[1].finish_reason == "length" and not found[1].retryable
        assert 2 not in found
        # Another prompt, another model: another request, not found.
        assert store.find("answer", ["0::1"], [digest("0::1", "other")]) == {}
        other = request_identity({"model": "m2"})
        assert store.find("answer", ["0::1"], [digest("0::1", identity=other)]) == {}
        assert store.reused == 2
    assert (tmp_path / "shard-0-of-1.log").stat().st_size == 0  # folded into the index


def test_answers_of_one_turn_are_written_together_at_its_end(tmp_path: Path) -> None:
    async def turn() -> int:
        with opened(tmp_path) as store:
            for i in range(3):
                store.add_answer(digest(f"0::{i}"), f"0::{i}", "a", "v", 1, 1)
            before = (tmp_path / "shard-0-of-1.log").stat().st_size
            await asyncio.sleep(0)
            assert (tmp_path / "shard-0-of-1.log").read_bytes().count(b"\n") == 3
            return before

    assert asyncio.run(turn()) == 0


def test_a_fresh_run_finds_nothing_and_its_answers_replace_the_old(tmp_path: Path) -> None:
    with opened(tmp_path) as store:
        store.add_answer(digest("0::1"), "0::1", "a", "old", 1, 1)
    with opened(tmp_path, fresh=True) as store:
        assert store.find("a", ["0::1"], [digest("0::1")]) == {}
        store.add_answer(digest("0::1"), "0::1", "a", "new", 1, 1)
    with opened(tmp_path) as store:
        assert store.find("a", ["0::1"], [digest("0::1")])[0].value == "new"


def test_a_fresh_run_sets_the_old_answers_aside_so_its_resume_finds_only_its_own(
    tmp_path: Path,
) -> None:
    keys = ["0::1", "0::2"]
    with opened(tmp_path) as store:
        for key in keys:
            store.add_answer(digest(key), key, "a", "old", 1, 1)
    with opened(tmp_path, fresh=True) as store:  # stopped after its first answer
        store.add_answer(digest("0::1"), "0::1", "a", "new", 1, 1)
    with opened(tmp_path) as store:  # the resume, without the flag
        found = store.find("a", keys, [digest(key) for key in keys])
    assert {at: result.value for at, result in found.items()} == {0: "new"}
    with opened(tmp_path, name="shard-0-of-1.before-fresh") as aside:  # kept whole, unread
        assert len(aside.find("a", keys, [digest(key) for key in keys])) == 2


def test_a_torn_last_line_is_left_out_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with opened(tmp_path) as store:
        store.add_answer(digest("0::1"), "0::1", "a", "kept", 1, 1)
    log = tmp_path / "shard-0-of-1.log"
    line = log.read_bytes()
    log.write_bytes(line + digest("0::2").hex().encode() + b'\t["0::2","a","tor')
    with caplog.at_level(logging.WARNING), opened(tmp_path) as store:
        keys = ["0::1", "0::2"]
        found = store.find("a", keys, [digest(k) for k in keys])
    assert [found[0].value, 1 in found] == ["kept", False]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "1 line(s) cut short" in warnings[0]


def test_a_damaged_index_is_set_aside_and_its_answers_asked_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with opened(tmp_path) as store:
        store.add_answer(digest("0::1"), "0::1", "a", "v", 1, 1)
    with opened(tmp_path):
        pass  # folded: the answer is in the index now
    index = tmp_path / "shard-0-of-1.sqlite"
    index.write_bytes(b"not a database" + bytes(4096))
    with caplog.at_level(logging.WARNING), opened(tmp_path) as store:
        assert store.find("a", ["0::1"], [digest("0::1")]) == {}
        store.add_answer(digest("0::1"), "0::1", "a", "again", 1, 1)
    assert (tmp_path / "shard-0-of-1.sqlite.damaged").exists()
    assert any("is damaged" in r.getMessage() for r in caplog.records)
    with opened(tmp_path) as store:  # the new index works
        assert store.find("a", ["0::1"], [digest("0::1")])[0].value == "again"


def test_pinned_results_are_found_whatever_the_digest(tmp_path: Path) -> None:
    with opened(tmp_path) as store:
        store.pin("0::1", "a", OutputResult(value="kept", input_tokens=1))
        assert store.lookups
        assert store.find("a", ["0::1"], [digest("0::1")])[0].value == "kept"


def test_two_rows_with_the_same_prompt_are_two_requests() -> None:
    assert digest("0::1", "same") != digest("0::2", "same")


def test_a_fresh_run_after_a_kill_does_not_glue_its_first_answer_to_a_torn_line(
    tmp_path: Path,
) -> None:
    with opened(tmp_path) as store:
        store.add_answer(digest("0::1"), "0::1", "a", "kept", 1, 1)
    log = tmp_path / "shard-0-of-1.log"
    log.write_bytes(log.read_bytes() + digest("0::2").hex().encode() + b'\t["0::2","a","tor')
    with opened(tmp_path, fresh=True) as store:  # the old answers go aside, whole lines only
        store.add_answer(digest("0::3"), "0::3", "a", "new", 1, 1)
    with opened(tmp_path) as store:
        keys = ["0::1", "0::2", "0::3"]
        found = store.find("a", keys, [digest(k) for k in keys])
    assert {at: result.value for at, result in found.items()} == {2: "new"}
    with opened(tmp_path, name="shard-0-of-1.before-fresh") as aside:
        assert aside.find("a", keys, [digest(k) for k in keys])[0].value == "kept"
