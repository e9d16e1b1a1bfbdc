from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest

from conftest import TEST_KEY
from llm_kit import LLM, BatchConfig, BatchItem, BatchResult, Message
from llm_kit.jsonl import JsonlWriter, drop_superseded, repair_torn_tail, scan
from provider_emulator import EmulatorConfig, Faults, running_emulator


def test_scan_reads_awkward_ids_and_foreign_lines(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    odd_ids = ['quote"d', "back\\slash", "ünïcode", '","ok":true', "plain"]
    with JsonlWriter(path) as writer:
        for i, item_id in enumerate(odd_ids):
            writer.write(BatchResult(item_id, i % 2 == 0, retryable=i % 2 == 1))
    with open(path, "ab") as f:
        f.write(b'{"ok": true, "id": "reordered", "retryable": false}\n\nnot json\n')
    checkpoint = scan(path)
    assert checkpoint.done == {*odd_ids, "reordered"}
    assert checkpoint.retryable == {"back\\slash", '","ok":true'}


def test_later_record_decides_retryability(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with JsonlWriter(path) as writer:
        writer.write(BatchResult("a", False, error="boom", retryable=True))
        writer.write(BatchResult("a", True, response="fine"))
    assert scan(path).retryable == set()


def test_repair_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"id":"a"}\n{"id":"b"}\n{"id":"c", "ok": tr')
    assert repair_torn_tail(path) == len(b'{"id":"c", "ok": tr')
    assert path.read_bytes() == b'{"id":"a"}\n{"id":"b"}\n'
    assert repair_torn_tail(path) == 0
    path.write_bytes(b"no newline at all")
    repair_torn_tail(path)
    assert path.read_bytes() == b""


def test_drop_superseded_keeps_the_newest_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with JsonlWriter(path) as writer:
        writer.write(BatchResult("a", False, retryable=True))
        writer.write(BatchResult("b", True))
        writer.write(BatchResult("a", True, response="second try"))
    assert drop_superseded(path, {"a"}) == 1
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [(r["id"], r["ok"]) for r in records] == [("b", True), ("a", True)]


async def test_retry_failed_reruns_only_retryable_failures(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    items = [BatchItem(f"r{i}", [Message.user(f"q{i}")]) for i in range(40)]
    config = BatchConfig(max_retries=0, worker_concurrency=8)
    with running_emulator(EmulatorConfig(faults=Faults(rate_500=0.5), seed=11)) as flaky:
        llm = LLM(model="m", base_url=flaky.openai_base_url, api_key=TEST_KEY, config=config)
        await llm.batch_to_jsonl(items, out)
        await llm.aclose()
    first = scan(out)
    assert len(first.done) == 40 and 5 < len(first.retryable) < 35
    with running_emulator(EmulatorConfig()) as healthy:
        llm = LLM(model="m", base_url=healthy.openai_base_url, api_key=TEST_KEY, config=config)
        assert await llm.batch_to_jsonl(items, out, resume=True) == 0  # resume alone: no retry
        written = await llm.batch_to_jsonl(items, out, retry_failed=True)
        await llm.aclose()
        assert healthy.stats()["requests"] == len(first.retryable) == written
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(records) == 40 and all(r["ok"] for r in records)


def test_scan_is_not_fooled_by_result_shaped_responses(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    nested = {"id": "ghost", "ok": False, "retryable": True}
    with JsonlWriter(path) as writer:
        writer.write(BatchResult("real", True, response=nested))
        writer.write(BatchResult("other", False, error="x", retryable=True))
    checkpoint = scan(path)
    assert checkpoint.done == {"real", "other"}
    assert checkpoint.retryable == {"other"}


async def test_a_zeroed_block_reruns_its_items_and_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out.jsonl"
    items = [BatchItem(f"r{i}", [Message.user(f"q{i}")]) for i in range(200)]
    with running_emulator(EmulatorConfig()) as emu:
        llm = LLM(model="m", base_url=emu.openai_base_url, api_key=TEST_KEY)
        await llm.batch_to_jsonl(items, out)
        data = bytearray(out.read_bytes())
        lines = bytes(data).splitlines(keepends=True)
        # A crash left 4 KB of NUL bytes after line 5's head (lines after it may be gone).
        head = sum(map(len, lines[:5])) + lines[5].index(b'"retryable":') + 20
        data[head : head + 4096] = b"\0" * 4096
        assert data.endswith(b"}\n")  # the block is inside the file, not a torn tail
        out.write_bytes(bytes(data))
        swallowed = {i.id for i in items if f'"id":"{i.id}"'.encode() not in data}
        requests_before = emu.stats()["requests"]
        with caplog.at_level(logging.WARNING, logger="llm_kit.jsonl"):
            written = await llm.batch_to_jsonl(items, out, resume=True)
        await llm.aclose()
        sent = emu.stats()["requests"] - requests_before
    assert "r5" not in swallowed  # the damaged line still names its item...
    assert written == sent == 1 + len(swallowed)  # ...yet it runs again, with those it hid
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(i.id for i in items)
    assert b"\0" in (tmp_path / "out.jsonl.unreadable").read_bytes()
    assert [r.getMessage() for r in caplog.records if str(out) in r.getMessage()]
