"""Rows that failed for a retryable reason are computed again by ``mmirage retry``, paying only
for their failed outputs, through the real CLI against the emulator (a fault storm during
``run``, then a calm emulator on the same address for ``retry``); and, through ``run_shard``,
which failures are retried (retryable ones) and which are not (a bad row, a refused request).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmirage.config import load_mmirage_config_dict
from mmirage.core.process.base import OutputRequest, OutputResult, Processor
from mmirage.core.shard import run_shard
from provider_emulator import EmulatorConfig, Faults, running_emulator

ROWS = 150
STORM = Faults(rate_429=0.15, rate_500=0.1, retry_after_s=0.01)


def mmirage(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": "sk-row-retry", "XDG_CACHE_HOME": str(root / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=root,
    )


def pipeline(root: Path, name: str, base_url: str, fmt: str = "jsonl") -> Path:
    """Two chained outputs (``summary`` reads ``answer``), no client-side retries: every
    fault of the storm becomes a recorded, retryable error."""
    rows = root / "rows.jsonl"
    if not rows.exists():
        rows.write_text("".join(json.dumps({"id": i, "text": f"t{i}"}) + "\n" for i in range(ROWS)))
    config = {
        "processors": [
            {
                "type": "llm",
                "base_url": base_url,
                "model": "echo",
                "worker_concurrency": 8,
                "max_retries": 0,
                "default_sampling_params": {"temperature": 0, "max_new_tokens": 32},
            }
        ],
        "loading_params": {
            "state_dir": str(root / name / "state"),
            "datasets": [{"path": str(rows), "type": "JSONL", "output_dir": str(root / name)}],
            "num_shards": 2,
            "batch_size": 20,
            "output_format": fmt,
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}, {"name": "text", "key": "text"}],
            "outputs": [
                {"name": "answer", "type": "llm", "prompt": "Row {{ id }}: {{ text }}"},
                {"name": "summary", "type": "llm", "prompt": "Sum up: {{ answer }}"},
            ],
            "output_schema": {"row": "{{ id }}", "answer": "{{ answer }}", "sum": "{{ summary }}"},
        },
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def published(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for k in range(2):
        path = out / f"shard-{k}-of-2.jsonl"
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


def test_retry_pays_only_for_the_failed_outputs_of_a_storm(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(faults=STORM, seed=3)) as storm:
        port = storm.port
        config = pipeline(tmp_path, "stormy", storm.openai_base_url)
        stormy = mmirage("run", str(config), root=tmp_path)
        assert storm.stats()["status"].get("429", 0) > 0  # the storm happened
    assert stormy.returncode == 1, stormy.stderr
    assert "'mmirage retry CONFIG' computes again" in stormy.stderr
    before = published(tmp_path / "stormy")
    failed = [r for r in before if r["__errors__"]]
    assert failed and all("__retry__" in r for r in failed)
    # A row whose answer failed never asked for its summary: both are owed; else the summary.
    owed = sum(2 if "answer" in r["__errors__"] else 1 for r in failed)
    assert owed > len(failed)  # some rows had their answer and only lack the summary

    checked = mmirage("check", str(config), root=tmp_path)
    assert checked.returncode == 1, checked.stdout
    assert "partial" in checked.stdout
    assert "row(s) failed for a retryable reason" in checked.stderr
    assert f"'mmirage retry {config}'" in checked.stderr

    with running_emulator(EmulatorConfig(), port=port) as calm:
        # A plain rerun keeps the finished shards as they are and sends nothing.
        rerun = mmirage("run", str(config), root=tmp_path)
        assert rerun.returncode == 1 and calm.stats()["requests"] == 0, rerun.stderr
        retried = mmirage("retry", str(config), root=tmp_path)
        assert retried.returncode == 0, retried.stderr
        assert calm.stats()["requests"] == owed  # exactly the failed outputs, nothing re-bought
        assert "now succeed, 0 failed again" in retried.stderr
        again = mmirage("retry", str(config), root=tmp_path)
        assert again.returncode == 0 and calm.stats()["requests"] == owed, again.stderr
        reference = pipeline(tmp_path, "calm", calm.openai_base_url)
        assert mmirage("run", str(reference), root=tmp_path).returncode == 0

    after = published(tmp_path / "stormy")
    assert after == published(tmp_path / "calm")  # every row, in order, as if no storm
    assert mmirage("check", str(config), root=tmp_path).returncode == 0
    merged = mmirage("merge", str(config), root=tmp_path)
    assert merged.returncode == 0, merged.stderr


# -- which failures are retried, through run_shard ----------------------------------------------


class FlakyProcessor(Processor):
    """Echoes the prompt; rows listed in ``flaky`` fail retryably (429) the first time only,
    rows in ``refused`` always fail for good (400)."""

    def __init__(self, flaky: Sequence[tuple[str, str]] = (), refused: Sequence[str] = ()) -> None:
        self.flaky, self.refused = set(flaky), set(refused)
        self.asked: list[tuple[str, str]] = []

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        results = []
        for r in requests:
            self.asked.append((r.row_key, output.name))
            if r.row_key in self.refused:
                results.append(OutputResult(error="400 bad request", input_tokens=2))
            elif (r.row_key, output.name) in self.flaky:
                self.flaky.discard((r.row_key, output.name))
                results.append(OutputResult(error="429 rate limited", retryable=True))
            else:
                results.append(OutputResult(value=f"<{r.prompt}>", input_tokens=1, output_tokens=1))
        return results

    async def aclose(self) -> None:
        pass


def unit_config(tmp_path: Path, fmt: str) -> Any:
    rows = tmp_path / "in.jsonl"
    lines = [json.dumps({"id": i, "text": f"t{i}"}) for i in range(10)]
    lines[4] = "{not json"
    rows.write_text("\n".join(lines) + "\n")
    return load_mmirage_config_dict(
        {
            "processors": [{"type": "llm", "base_url": "http://127.0.0.1:9", "model": "m"}],
            "loading_params": {
                "datasets": [{"path": str(rows), "type": "JSONL", "output_dir": str(tmp_path)}],
                "state_dir": str(tmp_path / "state"),
                "batch_size": 3,
                "output_format": fmt,
            },
            "processing_params": {
                "inputs": [{"name": "text", "key": "text"}],
                "outputs": [
                    {"name": "a", "type": "llm", "prompt": "A {{ text }}"},
                    {"name": "b", "type": "llm", "prompt": "B {{ a }}"},
                ],
                "output_schema": {"a": "{{ a }}", "b": "{{ b }}", "text": "{{ text }}"},
            },
        }
    )


def rows_of(path: Path) -> list[dict[str, Any]]:
    from mmirage.core.writer.formats import iter_rows

    return [row for batch in iter_rows(path) for row in batch]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_only_retryable_failures_are_retried_and_never_twice(tmp_path: Path, fmt: str) -> None:
    config = unit_config(tmp_path, fmt)
    flaky = FlakyProcessor(flaky=[("0::1", "b"), ("0::6", "a")], refused=["0::8"])
    first = run_shard(config, 0, processors={"llm": flaky})
    assert (first.rows_failed, first.rows_retryable) == (4, 2)  # 1, 6 | 4 (bad row), 8 (400)
    shard = tmp_path / f"shard-0-of-1.{fmt}"
    assert run_shard(config, 0, processors={"llm": flaky}).skipped  # a plain rerun keeps it

    flaky.asked.clear()
    report = run_shard(config, 0, processors={"llm": flaky}, retry_rows=True)
    # Row 1 only lacked b; row 6 lacked a (and so b). Rows 4 and 8 failed for good.
    assert sorted(flaky.asked) == [("0::1", "b"), ("0::6", "a"), ("0::6", "b")]
    assert (report.rows_failed, report.rows_retryable) == (2, 0)
    rows = rows_of(shard)
    assert [r["__row_key__"] for r in rows] == [f"0::{i}" for i in range(10)]
    assert rows[1]["b"] == "<B <A t1>>" and rows[6]["a"] == "<A t6>" and not rows[6]["__errors__"]
    assert rows[1]["__usage__"] == {"input_tokens": 2, "output_tokens": 2}
    assert all(not r.get("__retry__") for r in rows)
    errors = [
        {k: v for k, v in (r["__errors__"] or {}).items() if v} for r in rows
    ]  # Parquet: a struct
    assert errors[8] == {"a": "400 bad request"} and set(errors[4]) == {"__row__"}

    flaky.asked.clear()  # nothing is left to retry: the failures for good are not retried
    assert run_shard(config, 0, processors={"llm": flaky}, retry_rows=True).skipped
    assert flaky.asked == []
