"""What the live hot path promises beyond speed: a source read only as workers take items, one
write per completion batch of whole lines, and the garbage collector put back as it was."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import TEST_KEY
from llm_kit import LLM, BatchConfig, BatchItem, BatchItemFailed, BatchResult, Message, jsonl
from llm_kit.gcquiet import YOUNG_THRESHOLD


def make_llm(emulator: Any, **config: Any) -> LLM:
    return LLM(
        model="m",
        base_url=emulator.openai_base_url,
        api_key=TEST_KEY,
        config=BatchConfig(**{"worker_concurrency": 16, **config}),
    )


def items(n: int) -> Iterator[BatchItem]:
    return (BatchItem(f"i{k:05d}", [Message.user(f"row {k}")]) for k in range(n))


async def test_a_plain_iterable_is_read_only_as_workers_take_items(emulator: Any) -> None:
    pulled = finished = max_outstanding = 0

    def source() -> Iterator[BatchItem]:
        nonlocal pulled
        for item in items(600):
            pulled += 1
            yield item

    llm = make_llm(emulator, worker_concurrency=4, input_buffer_size=512)
    async for _ in llm.batch_stream(source()):
        finished += 1
        max_outstanding = max(max_outstanding, pulled - finished)
    assert finished == 600
    # in flight (4) + results waiting for the consumer (4) + the batch it is reading (4):
    # nothing is read ahead into a buffer.
    assert max_outstanding <= 3 * 4


async def test_results_that_complete_together_reach_the_file_in_one_write(
    emulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line_writes: list[bytes] = []
    real_write = os.write

    def counting_write(fd: int, data: Any) -> int:
        if bytes(data[:7]) == b'{"id":"':
            line_writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(jsonl.os, "write", counting_write)
    out = tmp_path / "out.jsonl"
    assert await make_llm(emulator, worker_concurrency=64).batch_to_jsonl(items(500), out) == 500
    monkeypatch.undo()
    assert len(line_writes) < 500  # one write per completion batch, not per line
    assert all(data.endswith(b"\n") for data in line_writes)  # each write ends a whole line
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["id"] for r in records) == [f"i{k:05d}" for k in range(500)]


def test_write_many_hands_a_batch_of_whole_lines_to_the_os_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real_write = os.write

    def short_write(fd: int, data: Any) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:100]))  # as a full disk or a signal may do

    path = tmp_path / "out.jsonl"
    batch = [BatchResult(f"r{k}", True, response="x" * 50) for k in range(5)]
    monkeypatch.setattr(jsonl.os, "write", short_write)
    with jsonl.JsonlWriter(path) as writer:
        writer.write_many(batch)
    monkeypatch.undo()
    assert len(calls) > 1  # the short writes went on until everything was written
    assert path.read_bytes() == b"".join(jsonl.encode_line(r) for r in batch)


async def test_the_sinks_quiet_the_gc_while_they_run_and_put_it_back(emulator: Any) -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int]] = []
    llm = make_llm(emulator)
    await llm.batch_to_callback(
        items(20), lambda _: seen.append((gc.get_threshold()[0], gc.get_freeze_count()))
    )
    assert all(young >= YOUNG_THRESHOLD and frozen > 0 for young, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    # Also when the run stops on a failure.
    failing = make_llm(emulator, on_failure="raise")
    bad = BatchItem("bad", [Message.user("x", image_urls=["/no/such/image.png"])])
    with pytest.raises(BatchItemFailed):
        async for _ in failing.batch_stream([bad]):
            pass
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


async def test_a_process_that_tuned_its_own_gc_keeps_its_settings(emulator: Any) -> None:
    before = gc.get_threshold()
    gc.set_threshold(0)  # automatic collection off
    gc.freeze()
    try:
        seen: list[int] = []
        await make_llm(emulator).batch_to_callback(
            items(5), lambda _: seen.append(gc.get_threshold()[0])
        )
        assert seen == [0] * 5
        assert gc.get_threshold()[0] == 0
        assert gc.get_freeze_count() > 0  # its own freeze was not undone
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_importing_llm_kit_leaves_rich_for_the_progress_bar() -> None:
    # rich costs ~2 MB of every live run's resident memory; only a bar needs it.
    probe = "import sys, llm_kit\nprint('rich' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
