"""``execution_params.mode: ray`` against a real two-node Ray cluster (``ray_support``: the
cluster, the counting emulator and the ``mmirage`` commands inside one loopback-only network
namespace), plus what holds without a cluster: the settings and the missing extra.

The cluster tests are marked ``ray`` and run by ``make test-ray`` (``MMIRAGE_RAY_TESTS=1``);
they skip where Ray is not installed or a network namespace cannot be made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ray_pipeline_support import (
    CONCURRENCY,
    LATENCY_S,
    NUM_SHARDS,
    ROWS,
    assert_asked_once_but_in_flight,
    needs_cluster,
    pipeline,
    prompt_of,
    published,
    write_rows,
)
from ray_support import can_unshare, in_namespace


@pytest.fixture(scope="module")
def namespace_ok() -> None:
    """Skip where no loopback-only namespace can be made, except in CI, where these must run."""
    why = can_unshare()
    if why and os.environ.get("CI"):
        pytest.fail(why)
    if why:
        pytest.skip(why)


# -- against the cluster ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory, namespace_ok: None) -> dict[str, Any]:
    """A ``mode: ray`` run whose worker node is SIGKILLed mid-shard, then check and a rerun."""
    root = tmp_path_factory.mktemp("ray_killed")
    write_rows(root)
    state = root / "state"
    spec = {
        "workdir": str(root),
        "state_dir": str(state),
        "config": pipeline(root, state_dir=state),
        "latency_s": LATENCY_S,
        "kill_worker": True,
        "kill_after_requests": 30,
        "commands": [
            ["run"],
            ["check"],
            ["run"],
            ["retry"],
            ["stats"],
            ["merge", "--format", "jsonl"],
        ],
    }
    result = in_namespace(spec)
    result["root"] = root
    return result


@pytest.mark.usefixtures("namespace_ok")
class TestKilledWorkerNode:
    """Two shards, one per node (each node has one CPU, each task takes one); the worker node
    is SIGKILLed (its whole process group: raylet, workers) while its shard is sending."""

    pytestmark = needs_cluster

    def test_the_worker_node_was_killed_mid_shard(self, killed_run: dict[str, Any]) -> None:
        killed = killed_run["killed"]
        assert killed["shard_dir"] != "None", killed_run["driver_stderr"][-3000:]
        assert killed["status_before"] == "running"
        shard = Path(killed["shard_dir"])
        status = json.loads((shard / "status.json").read_text())
        assert status["status"] == "success"
        assert status["attempts"] >= 2  # Ray ran the task again, on the node left

    def test_the_run_ends_with_every_row_exactly_once(self, killed_run: dict[str, Any]) -> None:
        run = killed_run["commands"][0]
        assert run["returncode"] == 0, run["stderr"][-3000:]
        assert "ray: cluster 127.0.0.1:6379" in run["stderr"]
        for k in range(NUM_SHARDS):
            assert f"ray: shard {k}/{NUM_SHARDS} succeeded" in run["stderr"]
        rows = published(killed_run["root"] / "out")
        assert [r["row"] for r in rows] == list(range(ROWS))  # none lost, none twice
        assert all(r["__errors__"] is None for r in rows)
        assert [r["answer"] for r in rows] == [f"echo: {prompt_of(i)}" for i in range(ROWS)]

    def test_no_answer_that_came_back_is_paid_twice(self, killed_run: dict[str, Any]) -> None:
        """Each distinct request is asked once, except those in flight when the node died (the
        emulator had them, the dead worker never saw their answers): at most CONCURRENCY."""
        print(assert_asked_once_but_in_flight(killed_run))  # the note's figures (pytest -s)

    def test_the_key_reached_the_tasks_and_no_file(self, killed_run: dict[str, Any]) -> None:
        """The nodes were started without it: the tasks had it from the driver (the rows
        succeeded), and neither Ray's logs and session files nor ours hold it."""
        assert killed_run["commands"][0]["returncode"] == 0
        assert killed_run["files_with_key"] == []

    def test_check_retry_stats_merge_and_a_rerun_see_it_finished(
        self, killed_run: dict[str, Any]
    ) -> None:
        check, rerun, retry, stats, merge = killed_run["commands"][1:]
        for command in (check, rerun, retry, stats, merge):
            assert command["returncode"] == 0, command["args"] + [command["stderr"][-2000:]]
            assert command["requests"] == 0  # nothing paid again
        assert f"{NUM_SHARDS} shard(s)" in check["stdout"]
        assert json.loads(retry["stdout"])["successful"] == NUM_SHARDS
        per_shard = json.loads(stats["stdout"])["per_shard"]
        assert [e["state"] for e in per_shard] == ["success"] * NUM_SHARDS
        assert sum(e["rows_done"] for e in per_shard) == ROWS
        merged = (killed_run["root"] / "out" / "merged.jsonl").read_text().splitlines()
        assert [json.loads(line)["row"] for line in merged] == list(range(ROWS))


@pytest.mark.usefixtures("namespace_ok")
class TestStoppedDriver:
    pytestmark = needs_cluster

    def test_sigterm_stops_the_tasks_and_the_same_command_resumes(self, tmp_path: Path) -> None:
        write_rows(tmp_path)
        state = tmp_path / "state"
        spec = {
            "workdir": str(tmp_path),
            "state_dir": str(state),
            "config": pipeline(tmp_path, state_dir=state),
            "latency_s": LATENCY_S,
            "terminate_after_requests": 60,
            "commands": [["run"], ["run"]],
        }
        result = in_namespace(spec)
        stopped, resumed = result["commands"]
        assert result["terminated"]
        assert stopped["returncode"] == 143, stopped["stderr"][-3000:]
        assert "interrupted by SIGTERM" in stopped["stderr"]
        statuses = [json.loads(p.read_text()) for p in state.glob("*/shard_*/status.json")]
        assert statuses and all(s["status"] == "success" for s in statuses)
        assert resumed["returncode"] == 0, resumed["stderr"][-3000:]
        assert "resumed after" in resumed["stderr"]
        rows = published(tmp_path / "out")
        assert [r["row"] for r in rows] == list(range(ROWS))
        asked = stopped["requests"] + resumed["requests"]
        assert asked <= ROWS + NUM_SHARDS * CONCURRENCY  # only those in flight at the stop


@pytest.mark.usefixtures("namespace_ok")
class TestStateFolderUnseen:
    pytestmark = needs_cluster

    def test_a_node_that_cannot_read_the_state_stops_the_run_before_any_request(
        self, tmp_path: Path
    ) -> None:
        write_rows(tmp_path)
        state = tmp_path / "state"
        state.mkdir()
        spec = {
            "workdir": str(tmp_path),
            "state_dir": str(state),
            "config": pipeline(tmp_path, state_dir=state),
            "hide_on_worker": str(state),  # the worker node sees an empty folder there
            "commands": [["run"]],
        }
        run = in_namespace(spec)["commands"][0]
        assert run["returncode"] == 2, run["stderr"][-3000:]
        assert run["requests"] == 0
        last = run["stderr"].strip().splitlines()[-1]
        assert "Ray node 127.0.0.1" in last and "cannot read" in last
        assert str(state) in last and "state_dir" in last


# -- without a cluster -------------------------------------------------------------------------


def _config_file(tmp_path: Path, **ray: Any) -> Path:
    write_rows(tmp_path)
    text = pipeline(tmp_path, state_dir=tmp_path / "state", **ray)
    path = tmp_path / "pipeline.yaml"
    path.write_text(text.replace("{base_url}", "http://127.0.0.1:9/v1"))
    return path


def test_without_ray_mode_ray_is_exit_2_naming_the_extra(tmp_path: Path) -> None:
    """Ray hidden from a real ``mmirage run`` (as where the extra is not installed)."""
    config = _config_file(tmp_path)
    hide_ray = (
        "import sys; sys.modules['ray'] = None; sys.argv = ['mmirage', 'run', sys.argv[1]]; "
        "from mmirage.cli import entry; entry()"
    )
    env = {**os.environ, "OPENAI_API_KEY": "sk-ray-test", "RAY_ADDRESS": ""}
    done = subprocess.run(
        [sys.executable, "-c", hide_ray, str(config)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "mmirage[ray]" in lines[-1] and "mode: ray" in lines[-1], done.stderr
    assert not (tmp_path / "out").exists()  # nothing ran


def test_a_bad_memory_size_is_refused_at_load(tmp_path: Path) -> None:
    config = _config_file(tmp_path, memory="lots")
    env = {**os.environ, "OPENAI_API_KEY": "sk-ray-test"}
    done = subprocess.run(
        [sys.executable, "-m", "mmirage", "check", str(config)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert "execution_params.ray.memory" in done.stderr and "8G" in done.stderr


def test_task_options_carry_the_settings() -> None:
    from mmirage.config.ray_settings import RayParams

    settings = RayParams(num_cpus=2, num_gpus=1, memory="1.5G", max_concurrent_shards=3)
    assert settings.task_options() == {"num_cpus": 2, "num_gpus": 1, "memory": 1610612736}


def test_a_tasks_gpus_size_its_engine() -> None:
    """One engine per task on the task's GPUs: tp_size left at 1 becomes their number."""
    from mmirage.executors.ray_task import on_task_gpus

    cfg = _loaded()
    assert on_task_gpus(cfg, 4).processors[0].server_args.tp_size == 4
    assert on_task_gpus(cfg, 0) is cfg


def _loaded() -> Any:
    from mmirage.config import load_mmirage_config_dict

    return load_mmirage_config_dict(
        {
            "processors": [{"type": "llm", "server_args": {"model_path": "some/model"}}],
            "loading_params": {
                "datasets": [{"path": "x.jsonl", "type": "JSONL", "output_dir": "out"}]
            },
            "processing_params": {
                "inputs": [{"name": "a", "key": "a"}],
                "outputs": [{"name": "b", "type": "llm", "prompt": "{{ a }}"}],
                "output_schema": {"b": "{{ b }}"},
            },
            "execution_params": {"mode": "ray"},
        }
    )


def test_a_retried_task_releases_the_shard_its_dead_attempt_left_running(tmp_path: Path) -> None:
    """On a real cluster the dead attempt ran on another host: its pid cannot be checked and
    its heartbeat is fresh for minutes. The retry (same Ray task id) marks it failed at once;
    another task (another run's) leaves it alone."""
    from mmirage.core.shard.state import shard_state
    from mmirage.executors.ray_task import record_task, release_dead_attempt
    from mmirage.rundir import RunDir, atomic_write_json, now_iso

    run_dir = RunDir(tmp_path / "state", "pipeline-x", "fp", 2)
    running = {"status": "running", "hostname": "node-b", "pid": 1, "heartbeat": now_iso()}
    atomic_write_json(run_dir.status_path(1), running)
    record_task(run_dir, 1, "task-a", "node-b-id")
    assert shard_state(running, 3) == "running"  # what anyone else would see for minutes

    assert not release_dead_attempt(run_dir, 1, "task-other")
    assert json.loads(run_dir.status_path(1).read_text())["status"] == "running"
    assert release_dead_attempt(run_dir, 1, "task-a")
    status = json.loads(run_dir.status_path(1).read_text())
    assert status["status"] == "failed" and "node-b-id" in status["error"]
