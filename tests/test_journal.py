"""The result journal's file: a header naming the configuration, one compact line per answer,
read back by a resumed run (older files too), compacted as rows are checkpointed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from mmirage.core.process.base import OutputResult
from mmirage.core.shard import journal as journal_module
from mmirage.core.shard.journal import ResultJournal


def opened(path: Path, fp: str = "fp-1") -> ResultJournal:
    journal = ResultJournal(path, fp)
    journal.open()
    return journal


def test_answers_come_back_to_a_resumed_run_of_the_same_configuration(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    journal = opened(path)
    journal.add("0::1", "answer", OutputResult(value={"n": 1}, input_tokens=3, output_tokens=4))
    journal.add("0::1", "label", OutputResult(value="x", input_tokens=1, output_tokens=2))
    journal.add("0::2", "answer", OutputResult(error="refused", retryable=True))  # not kept
    journal.close()

    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert lines == [
        {"fp": "fp-1"},
        ["0::1", "answer", {"n": 1}, 3, 4],
        ["0::1", "label", "x", 1, 2],
    ]

    again = opened(path)
    assert again.replays
    assert again.get("0::1", "answer") == OutputResult(
        value={"n": 1}, input_tokens=3, output_tokens=4
    )
    assert again.get("0::1", "label") == OutputResult(value="x", input_tokens=1, output_tokens=2)
    assert again.get("0::2", "answer") is None

    other = opened(path, "fp-2")  # another configuration: nothing of it is trusted
    assert not other.replays and other.get("0::1", "answer") is None


def test_a_torn_last_line_and_an_older_format_are_read(tmp_path: Path) -> None:
    path = tmp_path / "j.jsonl"
    old = {"fp": "fp-1", "key": "0::7", "output": "answer", "value": "v"}
    old |= {"input_tokens": 5, "output_tokens": 6}
    path.write_bytes(orjson.dumps(old) + b"\n" + b'["0::8", "answ')
    journal = opened(path)
    assert journal.get("0::7", "answer") == OutputResult(value="v", input_tokens=5, output_tokens=6)
    assert journal.get("0::8", "answer") is None
    journal.close()
    assert path.read_bytes().splitlines() == [b'{"fp":"fp-1"}', b'["0::7","answer","v",5,6]']


def test_settled_rows_leave_and_the_file_is_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "_COMPACT_AT", 10)
    path = tmp_path / "j.jsonl"
    journal = opened(path)

    async def answers() -> None:  # lines of one turn of the loop go out together
        for i in range(30):
            journal.add(f"0::{i}", "answer", OutputResult(value=i))
        await asyncio.sleep(0)

    asyncio.run(answers())
    assert len(path.read_bytes().splitlines()) == 31
    journal.settle([f"0::{i}" for i in range(25)])
    assert path.read_bytes().splitlines()[1:] == [
        orjson.dumps([f"0::{i}", "answer", i, 0, 0]) for i in range(25, 30)
    ]
    journal.close(remove=True)
    assert not path.exists()
