"""`mode: slurm` on a real single-node SLURM (scripts/slurm-dev-cluster.sh), against the emulator.

Array tasks run `python -m mmirage run CONFIG --shard-id K` on this machine and reach the
emulator on 127.0.0.1; the emulator's request counter tells what each step paid for.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provider_emulator import EmulatorConfig, running_emulator

pytestmark = pytest.mark.slurm
KEY = "sk-slurm-test"
ROWS = 40


def mmirage(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "OPENAI_API_KEY": KEY, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def squeue_states(job: str) -> dict[int, str]:
    done = subprocess.run(
        ["squeue", "-h", "-r", "-t", "all", "-j", job, "-o", "%i|%T"],
        capture_output=True,
        text=True,
        check=True,
    )
    out = {}
    for line in done.stdout.split():
        task, state = line.split("|")
        out[int(task.split("_")[1])] = state
    return out


def wait_until(condition: Callable[[], bool], timeout: float = 120, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def make_pipeline(
    root: Path,
    base_url: str,
    *,
    shards: int = 4,
    rows: int = ROWS,
    concurrency: int = 4,
    execution: dict[str, Any] | None = None,
    name: str = "pipeline",
) -> Path:
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(rows)))
    config = {
        "processors": [
            {
                "type": "llm",
                "base_url": base_url,
                "model": "m",
                "worker_concurrency": concurrency,
            }
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(root / "out")}],
            "num_shards": shards,
            "batch_size": 4,
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}, {"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Say {{ text }}"}],
            "output_schema": {"id": "{{ id }}", "answer": "{{ answer }}"},
        },
        "execution_params": {
            "mode": "slurm",
            "account": "dev",
            "gpus": 0,
            "cpus_per_task": 1,
            "time_limit": "10:00",
            "report_dir": str(root / "reports"),
            "hf_home": str(root / "hf"),
            "job_name": f"mmirage-test-{name}",
            "poll_interval_seconds": 0.5,
            "settle_time_seconds": 0,
            **(execution or {}),
        },
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def rows_of(root: Path) -> list[dict[str, Any]]:
    rows = []
    for shard in sorted((root / "out").glob("shard-*.jsonl")):
        rows += [json.loads(line) for line in shard.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["id"])


def status(root: Path, shard: int) -> dict[str, Any]:
    """The shard's status.json ({} until the shard has started)."""
    found = list((root / "state").glob(f"pipeline-*/shard_{shard}/status.json"))
    if not found:
        return {}
    data: dict[str, Any] = json.loads(found[0].read_text())
    return data


@pytest.fixture()
def emulator_slow() -> Iterator[Any]:
    """Slow enough that a shard of 200 rows at concurrency 2 runs ~10 s: a cancel or requeue
    lands mid-shard even on a fast machine."""
    with running_emulator(EmulatorConfig(latency_s=0.1)) as emu:
        yield emu


def test_four_shards_on_slurm_equal_a_local_run(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    slurm, local = tmp_path / "slurm", tmp_path / "local"
    slurm.mkdir()
    local.mkdir()
    config = make_pipeline(slurm, emulator.openai_base_url, execution={"merge": True})
    done = mmirage("run", str(config), cwd=slurm)
    assert done.returncode == 0, done.stderr
    job = done.stdout.strip().splitlines()[0]
    assert job.isdigit(), done.stdout  # the job id, first and alone on its line
    assert "submitted SLURM job" in done.stderr
    check = mmirage("check", str(config), cwd=slurm)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{job}_3" in check.stdout and "COMPLETED" in check.stdout
    local_config = make_pipeline(local, emulator.openai_base_url, execution={"mode": "local"})
    assert mmirage("run", str(local_config), cwd=local).returncode == 0
    assert rows_of(slurm) == rows_of(local) and len(rows_of(slurm)) == ROWS
    (script,) = (slurm / "state").glob("pipeline-*/slurm/job-*.sh")
    assert "--array=0-3" in script.read_text()
    # Finished shards are never resubmitted: a rerun submits nothing, prints no job id.
    again = mmirage("run", str(config), cwd=slurm)
    assert again.returncode == 0 and again.stdout == "", again.stderr


def test_a_cancelled_task_is_shown_and_retry_requests_only_its_unfinished_rows(
    slurm_cluster: None, emulator_slow: Any, tmp_path: Path
) -> None:
    rows = 400
    config = make_pipeline(
        tmp_path, emulator_slow.openai_base_url, shards=2, rows=rows, concurrency=2
    )
    job = mmirage("run", str(config), cwd=tmp_path).stdout.strip()
    assert job.isdigit()

    wait_until(
        lambda: int(status(tmp_path, 1).get("rows_done") or 0) > 0,
        what="shard 1's first checkpoint",
    )
    subprocess.run(["scancel", f"{job}_1"], check=True)
    wait_until(lambda: squeue_states(job).get(0) == "COMPLETED", what="shard 0")
    wait_until(lambda: squeue_states(job).get(1) == "CANCELLED", what="the cancelled task")
    check = mmirage("check", str(config), cwd=tmp_path)
    assert check.returncode == 1
    line = next(ln for ln in check.stdout.splitlines() if ln.startswith("1 "))
    assert "CANCELLED" in line and f"{job}_1" in line
    kept = int(status(tmp_path, 1)["rows_done"])
    emulator_slow.reset_stats()
    retry = mmirage("retry", str(config), "-y", cwd=tmp_path)
    assert retry.returncode == 0, retry.stderr
    wait_until(lambda: status(tmp_path, 1).get("status") == "success", what="the retried shard")
    paid = emulator_slow.stats()["requests"]
    assert 0 < paid <= rows // 2 - kept  # only shard 1's unfinished rows
    assert [r["id"] for r in rows_of(tmp_path)] == list(range(rows))


def test_without_y_off_a_terminal_retry_asks_and_exits_1(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    config = make_pipeline(tmp_path, emulator.openai_base_url, shards=2)
    retry = mmirage("retry", str(config), cwd=tmp_path)
    assert retry.returncode == 1
    assert "Retry 2 shard(s)? (y/N)" in retry.stderr and "pass -y" in retry.stderr
    assert not list(tmp_path.glob("state/pipeline-*/slurm/submissions.jsonl"))


def test_a_failing_task_shows_failed_with_its_log(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    # A setup line that fails: the task dies before mmirage starts (status.json never written).
    config = make_pipeline(
        tmp_path, emulator.openai_base_url, shards=1, execution={"setup": ["exit 3"]}
    )
    done = mmirage("run", str(config), "--wait", cwd=tmp_path)
    assert done.returncode == 1
    assert "FAILED" in done.stderr and "R-mmirage-test-pipeline." in done.stderr
    check = mmirage("check", str(config), cwd=tmp_path)
    assert check.returncode == 1
    assert "FAILED" in check.stdout and str(tmp_path / "reports") in check.stdout


def test_submit_shard_ids_and_print_script(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    config = make_pipeline(tmp_path, emulator.openai_base_url)
    printed = mmirage("submit", str(config), "--shard-ids", "0,2", "--print-script", cwd=tmp_path)
    assert printed.returncode == 0 and "#SBATCH --array=0,2\n" in printed.stdout
    assert not (tmp_path / "state").exists()  # printing submits nothing
    done = mmirage("submit", str(config), "--shard-ids", "0,2", "--wait", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").glob("shard-*")) == [
        "shard-0-of-4.jsonl",
        "shard-2-of-4.jsonl",
    ]
    bad = mmirage("submit", str(config), "--shard-ids", "9", cwd=tmp_path)
    assert bad.returncode == 2 and "0..3" in bad.stderr


def test_wait_survives_squeue_failing_for_a_while(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    """A PATH shim makes squeue fail its first calls: --wait retries, neither hangs nor lies."""
    shim = tmp_path / "bin"
    shim.mkdir()
    counter = tmp_path / "squeue-calls"
    real = subprocess.run(["which", "squeue"], capture_output=True, text=True).stdout.strip()
    (shim / "squeue").write_text(
        "#!/bin/bash\n"
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}\n"
        'if [ "$n" -ge 1 ] && [ "$n" -le 3 ]; then\n'
        '  echo "squeue: error: Socket timed out on send/recv operation" >&2; exit 1\n'
        "fi\n"
        f'exec {real} "$@"\n'
    )
    (shim / "squeue").chmod(0o755)
    config = make_pipeline(tmp_path, emulator.openai_base_url, shards=2)
    env = {"PATH": f"{shim}:{os.environ['PATH']}"}
    done = mmirage("run", str(config), "--wait", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert int(counter.read_text()) >= 5  # it failed three times and asked again
    assert len(rows_of(tmp_path)) == ROWS


def test_squeue_that_never_answers_ends_the_wait_with_exit_1(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "squeue").write_text("#!/bin/bash\necho 'squeue: error: down' >&2\nexit 1\n")
    (shim / "squeue").chmod(0o755)
    config = make_pipeline(tmp_path, emulator.openai_base_url, shards=1)
    env = {"PATH": f"{shim}:{os.environ['PATH']}"}
    started = time.monotonic()
    done = mmirage("run", str(config), "--wait", cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 1
    assert "squeue failed" in done.stderr and "mmirage check" in done.stderr
    assert time.monotonic() - started < 100


def test_no_sbatch_is_one_sentence_exit_2(emulator: Any, tmp_path: Path) -> None:
    config = make_pipeline(tmp_path, emulator.openai_base_url)
    env = {"PATH": str(Path(sys.executable).parent)}  # python, and no SLURM
    done = mmirage("run", str(config), cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: mode: slurm needs SLURM's sbatch on PATH (or use mode: local)"
    )


def test_sbatch_refusing_the_job_is_its_own_sentence_exit_2(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    config = make_pipeline(
        tmp_path, emulator.openai_base_url, execution={"partition": "no-such-partition"}
    )
    done = mmirage("run", str(config), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: sbatch refused the job:") and "partition" in line.lower()
    assert not list(tmp_path.glob("state/pipeline-*/slurm/submissions.jsonl"))


@pytest.mark.slow  # waits out a SLURM time limit; the drain itself is in test_time_limit_drain
def test_a_task_stopped_at_its_time_limit_resumes_from_its_checkpoint(
    slurm_cluster: None, tmp_path: Path
) -> None:
    """A 2-minute limit with TERM 45 s before it and a slow emulator: the task lets its request
    in flight come back, checkpoints, records "time limit" and exits; with the limit raised,
    its retry resumes from there, and no request was paid for twice.

    SLURM sends the signal at its next 30-s tick after ``limit - grace``, and may send it up to
    60 s early: here between 15 s (checkpoints exist) and ~110 s (600 rows at one request at a
    time, 0.25 s each, are still running)."""
    rows = 600
    with running_emulator(EmulatorConfig(latency_s=0.25)) as emu:
        limited = {"time_limit": "2", "signal_grace_seconds": 45}
        config = make_pipeline(
            tmp_path, emu.openai_base_url, shards=1, rows=rows, concurrency=1, execution=limited
        )
        job = mmirage("run", str(config), cwd=tmp_path).stdout.strip()
        assert job.isdigit()
        wait_until(
            lambda: squeue_states(job).get(0) not in (None, "PENDING", "RUNNING", "COMPLETING"),
            timeout=200,
            what="the time limit",
        )
        first = status(tmp_path, 0)
        assert first["status"] == "failed" and first["error"].startswith("time limit"), first
        kept = int(first["rows_done"])
        assert 0 < kept < rows
        paid = emu.stats()["requests"]
        assert emu.stats()["status"] == {"200": paid}  # the one in flight came back
        # The user raises the limit (not part of the fingerprint, nor is concurrency) and retries.
        make_pipeline(tmp_path, emu.openai_base_url, shards=1, rows=rows, concurrency=32)
        emu.reset_stats()
        retry = mmirage("retry", str(config), "-y", cwd=tmp_path)
        assert retry.returncode == 0, retry.stderr
        wait_until(
            lambda: status(tmp_path, 0).get("status") == "success", timeout=150, what="retry"
        )
        assert emu.stats()["requests"] == rows - paid
    assert [r["id"] for r in rows_of(tmp_path)] == list(range(rows))


def test_a_batch_api_pipeline_on_slurm_end_to_end(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"q": f"question {i}"}) + "\n" for i in range(30)))
    config = {
        "processors": [
            {
                "type": "batch_api",
                "provider": "openai",
                "model": "gpt-4o-mini",
                "base_url": emulator.openai_base_url,
                "metadata_output_path": str(tmp_path / "receipts" / "meta.jsonl"),
                "max_requests_per_chunk": 4,
            }
        ],
        "loading_params": {
            "state_dir": str(tmp_path / "state"),
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(tmp_path / "o")}],
            "num_shards": 3,
        },
        "processing_params": {
            "inputs": [{"name": "q", "key": "q"}],
            "outputs": [{"name": "a", "type": "batch_api", "prompt": "{{ q }}"}],
            "output_schema": {"q": "{{ q }}", "a": "{{ a }}"},
        },
        "execution_params": {
            "mode": "slurm",
            "account": "dev",
            "gpus": 0,
            "cpus_per_task": 1,
            "report_dir": str(tmp_path / "reports"),
            "hf_home": str(tmp_path / "hf"),
            "poll_interval_seconds": 0.5,
            "settle_time_seconds": 0,
        },
    }
    path = tmp_path / "batch.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    merged = tmp_path / "merged.jsonl"
    done = mmirage("run", str(path), "--wait", "--output-path", str(merged), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in merged.read_text().splitlines()]
    assert [r["q"] for r in rows] == [f"question {i}" for i in range(30)]
    assert all(r["a"] and not r["a"].startswith("__BATCH_SUBMITTED__") for r in rows)
    receipts = (tmp_path / "receipts").glob("*")
    shards = {json.loads(line)["shard_id"] for p in receipts for line in p.read_text().splitlines()}
    assert shards == {0, 1, 2}
    export = mmirage("run", str(path), "--export-prompts", str(tmp_path / "p.jsonl"), cwd=tmp_path)
    assert export.returncode == 2 and "only with mode: local" in export.stderr


def test_signal_handler_names_the_time_limit_near_the_deadline(tmp_path: Path) -> None:
    from mmirage.core.shard.stop import DEADLINE_ENV, slurm_seconds, stop_reason

    assert slurm_seconds("1") == 60 and slurm_seconds("1:30") == 90
    assert slurm_seconds("11:59:59") == 43199 and slurm_seconds("1-00:00:00") == 86400
    assert slurm_seconds("2-3") == 51 * 3600
    os.environ[DEADLINE_ENV] = str(time.time() + 100)
    try:
        assert stop_reason(signal.SIGTERM, 120).startswith("time limit")
        assert stop_reason(signal.SIGTERM, 10) == "interrupted"
    finally:
        del os.environ[DEADLINE_ENV]
    assert stop_reason(signal.SIGTERM, 120) == "interrupted"


# 2-3 min of SLURM requeue; resuming without paying twice is in test_kill_resume_cli too.
@pytest.mark.slow
def test_a_requeued_task_resumes_without_paying_twice(
    slurm_cluster: None, emulator_slow: Any, tmp_path: Path
) -> None:
    """Preemption: SLURM requeues a running task; it runs again and resumes at its checkpoint."""
    rows = 200
    config = make_pipeline(
        tmp_path, emulator_slow.openai_base_url, shards=1, rows=rows, concurrency=2
    )
    job = mmirage("run", str(config), cwd=tmp_path).stdout.strip()
    wait_until(
        lambda: (
            (tmp_path / "state").exists() and int(status(tmp_path, 0).get("rows_done") or 0) > 0
        ),
        what="the first checkpoint",
    )
    subprocess.run(["scontrol", "requeue", f"{job}_0"], check=True)
    wait_until(
        lambda: (
            status(tmp_path, 0).get("status") == "success" and status(tmp_path, 0)["attempts"] == 2
        ),
        timeout=240,
        what="the requeued task",
    )
    assert status(tmp_path, 0)["attempts"] == 2  # it ran again, after the requeue
    # Only requests in flight at the requeue may be sent twice (the journal keeps the rest).
    assert emulator_slow.stats()["requests"] <= rows + 2
    assert [r["id"] for r in rows_of(tmp_path)] == list(range(rows))


def test_an_edit_or_a_recompute_resubmits_the_shards_and_pays_only_for_what_changed(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    """A finished array: an edited prompt submits the shards again and pays one request per
    row; ``--recompute`` pays nothing; the task command carries the run id and the flag."""
    config = make_pipeline(tmp_path, emulator.openai_base_url, shards=2)
    emulator.reset_stats()  # the emulator serves the whole session
    assert mmirage("run", str(config), "--wait", cwd=tmp_path).returncode == 0
    assert emulator.stats()["requests"] == ROWS

    edited = yaml.safe_load(config.read_text())
    edited["processing_params"]["outputs"][0]["prompt"] = "Repeat {{ text }}"
    config.write_text(yaml.safe_dump(edited, sort_keys=False))
    done = mmirage("run", str(config), "--wait", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert emulator.stats()["requests"] == 2 * ROWS
    assert all(row["answer"] == f"echo: Repeat row {row['id']}" for row in rows_of(tmp_path))

    done = mmirage("run", str(config), "--recompute", "--wait", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert emulator.stats()["requests"] == 2 * ROWS  # all from the answer store
    scripts = sorted((tmp_path / "state").rglob("slurm/job-*.sh"), key=lambda p: p.stat().st_mtime)
    assert scripts and "--recompute" in scripts[-1].read_text()
    assert "--run-id" in scripts[-1].read_text()
