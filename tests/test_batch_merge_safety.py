"""``mmirage merge`` trusts only what the run itself wrote: the real command line in a
subprocess, over real HTTP to the emulator.

* a value that looks like a placeholder (in a dataset column, or in a live model's answer) is
  data, never filled with another row's result;
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batch_spec_support import (
    PLACEHOLDER,
    cli_env,
    mmirage,
    read_jsonl,
    request_totals,
    write_rows,
    write_yaml,
)
from llm_kit.emulator import EmulatorConfig, running_emulator
from llm_kit.emulator.runner import EmulatorHandle

KEY = "sk-merge-safety-7788"
MODEL = "gpt-4o-mini"


@pytest.fixture(scope="module")
def verbatim() -> Iterator[EmulatorHandle]:
    """Answers each prompt with the prompt itself: a test says what the model answers."""
    with running_emulator(EmulatorConfig(responder="verbatim"), subprocess=True) as emu:
        yield emu


def env() -> dict[str, str]:
    return cli_env(OPENAI_API_KEY=KEY)


def live_and_batch_config(tmp_path: Path, emu: EmulatorHandle, rows: list[dict[str, Any]]) -> Path:
    """A live ``llm`` output (``draft``: says ``say``) then a ``batch_api`` one (``answer``)."""
    return write_yaml(
        tmp_path / "spoof.yaml",
        {
            "processors": [
                {
                    "type": "llm",
                    "model": MODEL,
                    "base_url": emu.openai_base_url,
                    "message_format": "openai",
                },
                {
                    "type": "batch_api",
                    "provider": "openai",
                    "model": MODEL,
                    "base_url": emu.openai_base_url,
                },
            ],
            "loading_params": {
                "datasets": [
                    {
                        "path": write_rows(tmp_path / "rows.jsonl", rows),
                        "type": "JSONL",
                        "output_dir": str(tmp_path / "out"),
                    }
                ],
                "num_shards": 1,
                "state_dir": str(tmp_path / "state"),
                "output_format": "jsonl",
            },
            "processing_params": {
                "inputs": [
                    {"name": "question", "key": "q"},
                    {"name": "note", "key": "note"},
                    {"name": "say", "key": "say"},
                ],
                "outputs": [
                    {"name": "draft", "type": "llm", "prompt": "{{ say }}"},
                    {"name": "answer", "type": "batch_api", "prompt": "Answer: {{ question }}"},
                ],
                "output_schema": {
                    "question": "{{ question }}",
                    "note": "{{ note }}",
                    "draft": "{{ draft }}",
                    "answer": "{{ answer }}",
                },
            },
        },
    )


def test_placeholder_look_alikes_in_data_or_live_answers_are_left_as_they_are(
    verbatim: EmulatorHandle, tmp_path: Path
) -> None:
    spoof_data = f"{PLACEHOLDER}answer-text-0"  # row 0's request, named by row 3's data
    spoof_live = f"{PLACEHOLDER}answer-text-1"  # what the live model answers for row 2
    rows = [{"q": f"question {i}", "note": f"note {i}", "say": f"hello {i}"} for i in range(4)]
    rows[3]["note"] = spoof_data
    rows[2]["say"] = spoof_live
    config = live_and_batch_config(tmp_path, verbatim, rows)
    run = mmirage("run", "--config", config, env=env())
    assert run.code == 0, str(run)
    out = tmp_path / "merged.jsonl"
    merge = mmirage("merge", "--config", config, "--output-path", out, env=env())
    assert merge.code == 0, str(merge)

    merged = read_jsonl(out)
    assert [r["answer"] for r in merged] == [f"Answer: question {i}" for i in range(4)]
    assert merged[3]["note"] == spoof_data  # data, kept as it was
    assert merged[2]["draft"] == spoof_live  # the live model's answer, kept as it was
    assert [r["__errors__"] for r in merged] == [None] * 4
    # One batch request per row, each row's tokens counted once.
    assert request_totals(merge.out)["total"] == 4, merge.out
    tokens = {r["input_tokens"] for r in merged}
    assert len(tokens) == 1, merged  # the four answers' prompts have the same length
