"""Pay once, through the real CLI against the emulator (requests counted where they arrive):
an edited config recomputes its shards from stored answers and asks only for the requests it
changed; ``--fresh`` asks everything again; ``retry`` never buys a stored answer twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provider_emulator import EmulatorConfig, running_emulator

ROWS = 6


@pytest.fixture(scope="module")
def emu() -> Iterator[Any]:
    with running_emulator(EmulatorConfig()) as handle:
        yield handle


def pipeline(tmp: Path, base_url: str, **edits: Any) -> Path:
    data = tmp / "data.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"text": f"review {i}"}) + "\n" for i in range(ROWS)))
    body = {
        "processors": [{"type": "llm", "base_url": base_url, "model": "m"}],
        "loading_params": {
            "state_dir": str(tmp / "state"),
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(tmp / "out")}],
            "output_format": "jsonl",
            "num_shards": 2,
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [
                {"name": "summary", "type": "llm", "prompt": "Summarise: {{ text }}"},
                {
                    "name": "label",
                    "type": "llm",
                    "prompt": edits.get("label_prompt", "Label: {{ summary }}"),
                    "output_type": "JSON",
                    "output_schema": {"sentiment": "str"},
                },
            ],
            "output_schema": edits.get(
                "output_schema", {"summary": "{{ summary }}", "sentiment": "{{ label.sentiment }}"}
            ),
        },
    }
    path = tmp / "pipeline.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-pay-once-test"}
    done = subprocess.run(
        [sys.executable, "-m", "mmirage", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done


def paid(emu: Any, *args: str) -> tuple[int, str]:
    """Requests the emulator received for ``mmirage ARGS``, and its stderr."""
    emu.reset_stats()
    done = run(*args)
    return int(emu.stats()["requests"]), done.stderr


def published(tmp: Path) -> list[dict[str, Any]]:
    rows = []
    for k in range(2):
        text = (tmp / "out" / f"shard-{k}-of-2.jsonl").read_text()
        rows += [json.loads(line) for line in text.splitlines()]
    return rows


def test_edits_ask_only_for_the_requests_they_changed(tmp_path: Path, emu: Any) -> None:
    config = pipeline(tmp_path, emu.openai_base_url)
    assert paid(emu, "run", str(config))[0] == 2 * ROWS

    schema = {"summary": "{{ summary }}", "mood": "{{ label.sentiment }}"}
    config = pipeline(tmp_path, emu.openai_base_url, output_schema=schema)
    requests, stderr = paid(emu, "run", str(config))
    assert requests == 0
    # One line per shard (3 rows x 2 outputs each).
    assert stderr.count("6 answer(s) reused from the answer store, 0 request(s) sent") == 2
    assert all(
        set(row) >= {"summary", "mood"} and "sentiment" not in row for row in published(tmp_path)
    )

    prompt = "Label the sentiment of: {{ summary }}"
    config = pipeline(tmp_path, emu.openai_base_url, output_schema=schema, label_prompt=prompt)
    assert paid(emu, "run", str(config))[0] == ROWS  # the label only, once per row
    assert paid(emu, "run", str(config))[0] == 0  # published: skipped
    assert paid(emu, "run", str(config), "--recompute")[0] == 0  # from the store
    assert paid(emu, "run", str(config), "--fresh")[0] == 2 * ROWS  # asked again on purpose


def test_a_shard_recomputed_after_an_edit_is_published_whole(tmp_path: Path, emu: Any) -> None:
    config = pipeline(tmp_path, emu.openai_base_url)
    run("run", str(config))
    before = published(tmp_path)
    config = pipeline(tmp_path, emu.openai_base_url, output_schema={"s": "{{ summary }}"})
    run("run", str(config))
    after = published(tmp_path)
    assert [row["__row_key__"] for row in after] == [row["__row_key__"] for row in before]
    assert [row["s"] for row in after] == [row["summary"] for row in before]
    assert not any("summary" in row for row in after)  # no row of the old configuration
    check = subprocess.run(
        [sys.executable, "-m", "mmirage", "check", str(config)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_old_shard_stays_readable_while_an_edit_recomputes_it(tmp_path: Path) -> None:
    """Readers (a plain merge, a dashboard) see the old shard until the new one replaces it,
    never a moment without one; merge of batch results refuses it meanwhile."""
    with running_emulator(EmulatorConfig(latency_s=1.0)) as slow:
        config = pipeline(tmp_path, slow.openai_base_url)
        run("run", str(config), "--shard-id", "0")
        shard = tmp_path / "out" / "shard-0-of-2.jsonl"
        before = shard.read_bytes()
        marker = tmp_path / "out" / ".parts" / "shard-0-of-2.recompute"
        prompt = "Label the mood of: {{ summary }}"
        edited = pipeline(tmp_path, slow.openai_base_url, label_prompt=prompt)
        env = {**os.environ, "OPENAI_API_KEY": "sk-pay-once-test"}
        child = subprocess.Popen(
            [sys.executable, "-m", "mmirage", "run", str(edited), "--shard-id", "0"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen = False
        while child.poll() is None:
            if marker.exists():
                now = shard.read_bytes()  # never missing, never half of one
                seen = seen or now == before
                assert now == before or now.count(b"\n") == before.count(b"\n")
        _, stderr = child.communicate()
        assert child.returncode == 0, stderr
    assert seen, "the old shard was never read during the recompute"
    assert not marker.exists() and shard.read_bytes() != before
    assert all(json.loads(line)["__errors__"] is None for line in shard.read_text().splitlines())
