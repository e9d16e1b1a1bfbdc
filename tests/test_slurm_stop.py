"""``scancel`` pays nothing twice: SLURM sends each task SIGTERM, then SIGKILL after KillWait
(5 s on the dev cluster); each task drains its requests in flight within that (the job script
tells it KillWait), records "interrupted" and exits, and ``mmirage retry`` asks only for what
nobody asked for before.

On the real single-node SLURM of scripts/slurm-dev-cluster.sh, against the emulator on
127.0.0.1, which counts every request it is sent.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from provider_emulator import EmulatorConfig, running_emulator
from test_slurm import make_pipeline, mmirage, rows_of, squeue_states, status, wait_until

pytestmark = pytest.mark.slurm
ROWS = 160
SHARDS = 2


def test_scancel_of_a_whole_job_drains_every_task(slurm_cluster: None, tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(latency_s=0.5, latency_jitter_s=0.5)) as emu:
        config = make_pipeline(
            tmp_path, emu.openai_base_url, shards=SHARDS, rows=ROWS, concurrency=8
        )
        job = mmirage("run", str(config), cwd=tmp_path).stdout.strip()
        assert job.isdigit()

        def sending() -> bool:
            stats = emu.stats()
            running = all(status(tmp_path, k).get("status") == "running" for k in range(SHARDS))
            return running and stats["requests"] > sum(stats["status"].values())

        wait_until(sending, what="both tasks sending")
        subprocess.run(["scancel", job], check=True)  # the whole job, as a user does
        wait_until(
            lambda: all(s not in ("RUNNING", "COMPLETING") for s in squeue_states(job).values()),
            what="the tasks to end",
        )
        first = emu.stats()
        assert 0 < first["requests"] < ROWS
        assert first["status"] == {"200": first["requests"]}  # each came back before the exit
        for k in range(SHARDS):
            state = status(tmp_path, k)
            assert state["status"] == "failed" and state["error"] == "interrupted", state
            log = next((tmp_path / "reports").glob(f"R-*.{job}_{k}.err")).read_text()
            assert "interrupted by SIGTERM: " in log, log

        retry = mmirage("retry", str(config), "-y", cwd=tmp_path)
        assert retry.returncode == 0, retry.stderr
        wait_until(
            lambda: all(status(tmp_path, k).get("status") == "success" for k in range(SHARDS)),
            timeout=240,
            what="the retried shards",
        )
        assert emu.stats()["requests"] == ROWS  # the first run's and the retry's, each once
    assert [row["id"] for row in rows_of(tmp_path)] == list(range(ROWS))
