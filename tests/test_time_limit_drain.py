"""A shard stopped at its SLURM time limit lets its requests in flight come back first: every
request it paid for is journaled, and its retry pays only for the rows nobody asked for yet.

The real CLI in a subprocess (local mode: the task's own signal handling, without a cluster)
with the SLURM deadline the job script would export, against the emulator on 127.0.0.1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mmirage.core.shard.stop import DEADLINE_ENV
from provider_emulator import EmulatorConfig, running_emulator
from test_retry_cli import checkpointed, statuses, wait_for
from test_slurm import make_pipeline, rows_of

ROWS = 120
CONCURRENCY = 8
KEY = "sk-drain-test"


def pipeline(root: Path, base_url: str) -> Path:
    local = {"mode": "local"}  # the task's own signal handling, with no cluster around it
    return make_pipeline(
        root, base_url, shards=1, rows=ROWS, concurrency=CONCURRENCY, execution=local
    )


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
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stopped at the SLURM time limit: ") and "kept" in last, last
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
    assert [row["id"] for row in rows_of(tmp_path)] == list(range(ROWS))
