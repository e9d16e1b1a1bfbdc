"""The pipeline the Ray tests run and what they check afterwards: one prompt per row, published
shards read back, and which requests the emulator was asked more than once after a node was
killed. Shared by tests/test_ray_mode.py and tests/test_ray_object_storage.py."""

from __future__ import annotations

import importlib.util
import json
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

ROWS = 400
NUM_SHARDS = 2
CONCURRENCY = 4
LATENCY_S = 0.1
SLACK_S = 1.0  # an answer ready this long before the kill had reached the killed worker
IN_TRANSIT_S = 0.1

needs_cluster = [
    pytest.mark.ray,
    pytest.mark.skipif(
        os.environ.get("MMIRAGE_RAY_TESTS") != "1",
        reason="a Ray cluster per test: run by `make test-ray` (MMIRAGE_RAY_TESTS=1)",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("ray") is None and not os.environ.get("CI"),
        reason="ray is not installed (`make test-ray` installs the ray extra)",
    ),
]


def prompt_of(i: int) -> str:
    return f"Row {i}: item number {i}"


def pipeline(
    root: Path,
    *,
    state_dir: Path,
    mode: str = "ray",
    dataset: dict[str, Any] | None = None,
    **ray: Any,
) -> str:
    """The pipeline's YAML; ``{base_url}`` is the emulator's, filled in by the driver.
    ``dataset`` replaces the local ``rows.jsonl`` → ``out`` entry (object storage, say)."""
    local = {"path": str(root / "rows.jsonl"), "type": "JSONL", "output_dir": str(root / "out")}
    config = {
        "processors": [
            {
                "type": "llm",
                "base_url": "{base_url}",
                "model": "echo",
                "worker_concurrency": CONCURRENCY,
                "default_sampling_params": {"temperature": 0, "max_new_tokens": 32},
            }
        ],
        "loading_params": {
            "state_dir": str(state_dir),
            "datasets": [dataset or local],
            "num_shards": NUM_SHARDS,
            "batch_size": 20,
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}],
            "outputs": [
                {"name": "answer", "type": "llm", "prompt": "Row {{ id }}: item number {{ id }}"}
            ],
            "output_schema": {"row": "{{ id }}", "answer": "{{ answer }}"},
        },
        "execution_params": {"mode": mode, "ray": ray, "max_retries": 3},
    }
    return yaml.safe_dump(config, sort_keys=False)


def write_rows(root: Path) -> None:
    with open(root / "rows.jsonl", "w") as f:
        for i in range(ROWS):
            f.write(json.dumps({"id": i}) + "\n")


def published(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for k in range(NUM_SHARDS):
        path = out / f"shard-{k}-of-{NUM_SHARDS}.jsonl"
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows


def events(root: Path) -> list[dict[str, Any]]:
    log = root / "requests.log"
    return [json.loads(line) for line in log.read_bytes().splitlines() if line.strip()]


def resent_after_kill(result: dict[str, Any]) -> tuple[Counter[str], list[str]]:
    """Requests per prompt beyond the first, and the prompts asked again although their
    answer had come back well before the kill (``result``: ``in_namespace``'s, with ``root``)."""
    log = events(result["root"])
    kill = result["killed"]["time"]
    done = {e["id"]: e["t"] for e in log if e["ev"] == "done"}
    attempts: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in log:
        if e["ev"] == "recv":
            attempts[e["prompt"]].append(e)
    extra: Counter[str] = Counter()
    paid_twice = []
    for prompt, tries in attempts.items():
        extra[prompt] = len(tries) - 1
        for attempt in tries[:-1]:
            answered = done.get(attempt["id"])
            if attempt["t"] - IN_TRANSIT_S > kill or (
                answered is not None and answered < kill - SLACK_S
            ):
                paid_twice.append(prompt)
    return +extra, paid_twice


def assert_asked_once_but_in_flight(result: dict[str, Any]) -> str:
    """Every prompt was asked; none whose answer came back was asked again; at most
    CONCURRENCY (those in flight when the node died) went twice. The figures, for the note."""
    log = events(result["root"])
    asked = {e["prompt"] for e in log if e["ev"] == "recv"}
    assert asked == {prompt_of(i) for i in range(ROWS)}
    extra, paid_twice = resent_after_kill(result)
    assert not paid_twice, sorted(set(paid_twice))[:5]
    assert sum(extra.values()) <= CONCURRENCY, extra.most_common(5)
    requests = sum(1 for e in log if e["ev"] == "recv")
    return (
        f"requests: {requests} for {len(asked)} distinct prompts; "
        f"re-sent after the kill: {sum(extra.values())}"
    )
