"""A shard stopped at its SLURM time limit lets its requests in flight come back first: every
request it paid for is journaled, and its retry pays only for the rows nobody asked for yet.

The real CLI in a subprocess (local mode: the task's own signal handling, without a cluster)
with the SLURM deadline the job script would export, against the emulator on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from llm_kit.emulator import EmulatorConfig, running_emulator
from mmirage.core.shard.stop import DEADLINE_ENV
from test_retry_cli import checkpointed, statuses, wait_for

ROWS = 120
CONCURRENCY = 8
KEY = "sk-drain-test"


def pipeline(root: Path, base_url: str) -> Path:
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(ROWS)))
    config = {
        "processors": [
            {"type": "llm", "base_url": base_url, "model": "m", "worker_concurrency": CONCURRENCY}
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(root / "out")}],
            "num_shards": 1,
            "batch_size": 4,
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}, {"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Say {{ text }}"}],
            "output_schema": {"id": "{{ id }}", "answer": "{{ answer }}"},
        },
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def mmirage(config: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "mmirage", "run", str(config)],
        env={**os.environ, "OPENAI_API_KEY": KEY, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def in_flight(stats: dict[str, Any]) -> int:
    return int(stats["requests"]) - sum(stats["status"].values())


def stopped_at_the_time_limit(tmp_path: Path, emu: Any) -> tuple[dict[str, Any], int]:
    """Run until the first checkpoint, then SIGTERM as SLURM does a minute before the end;
    the shard's status and the requests the run paid for."""
    config = pipeline(tmp_path, emu.openai_base_url)
    run = mmirage(config, **{DEADLINE_ENV: str(int(time.time()) + 60)})
    try:
        wait_for(lambda: checkpointed(tmp_path) > 0, "the first checkpoint")
        wait_for(lambda: in_flight(emu.stats()) > 0, "requests in flight")
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 128 + signal.SIGTERM, stderr
    return statuses(tmp_path)[0], emu.stats()["requests"]


def test_a_time_limit_stop_pays_for_no_request_twice(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(latency_s=0.5, latency_jitter_s=0.3)) as emu:
        status, paid = stopped_at_the_time_limit(tmp_path, emu)
        assert status["status"] == "failed" and status["error"].startswith("time limit")
        assert 0 < paid < ROWS
        assert emu.stats()["status"] == {"200": paid}  # each came back before the exit
        emu.reset_stats()
        retry = mmirage(pipeline(tmp_path, emu.openai_base_url))
        _, stderr = retry.communicate(timeout=120)
        assert retry.returncode == 0, stderr
        assert emu.stats()["requests"] == ROWS - paid  # the drained answers were kept
    published = (tmp_path / "out" / "shard-0-of-1.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in published) == list(range(ROWS))
