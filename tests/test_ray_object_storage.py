"""``mode: ray`` with the data on object storage (issue 32, item 4): inside ONE loopback-only
network namespace, a two-node Ray cluster, the counting emulator and a ``moto_server``
(``ray_support`` with ``spec["s3"]``). The dataset is uploaded to ``s3://``, the pipeline reads
it from there and publishes its shards there, and the worker node (its ``ray start --block``
process group) is SIGKILLed while its shard is sending.

Marked ``ray`` like tests/test_ray_mode.py: run by ``make test-ray`` (``MMIRAGE_RAY_TESTS=1``);
skipped where Ray, moto or ``unshare`` is missing, failing instead under ``CI``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

import s3_support
from ray_pipeline_support import (
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

BUCKET = "mmirage-ray"  # the namespace's own moto server: no other test shares it


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A ``mode: ray`` run from s3:// to s3:// whose worker node dies mid-shard, then check."""
    why = can_unshare() or s3_support.missing()
    if why and os.environ.get("CI"):
        pytest.fail(why)
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("ray_s3_killed")
    write_rows(root)
    state = root / "state"
    dataset = {
        "path": f"s3://{BUCKET}/in/rows.jsonl",
        "type": "JSONL",
        "output_dir": f"s3://{BUCKET}/out",
        "storage_options": s3_support.OPTIONS,  # names of variables, never their values
    }
    spec = {
        "workdir": str(root),
        "state_dir": str(state),
        "config": pipeline(root, state_dir=state, dataset=dataset),
        "latency_s": LATENCY_S,
        "kill_worker": True,
        "kill_after_requests": 30,
        "s3": {"bucket": BUCKET, "upload": {"in/rows.jsonl": "upload.jsonl"}, "read_back": "out/"},
        "commands": [["run"], ["check"]],
    }
    (root / "rows.jsonl").rename(root / "upload.jsonl")  # no local copy: the run reads the object
    result = in_namespace(spec)
    result["root"] = root
    return result


class TestKilledWorkerNodeOnS3:
    """Two shards, one per node; the worker node dies while its shard is sending."""

    pytestmark = needs_cluster

    def test_the_worker_node_was_killed_mid_shard(self, killed_run: dict[str, Any]) -> None:
        killed = killed_run["killed"]
        assert killed["shard_dir"] != "None", killed_run["driver_stderr"][-3000:]
        assert killed["status_before"] == "running"
        status = json.loads((Path(killed["shard_dir"]) / "status.json").read_text())
        assert status["status"] == "success"
        assert status["attempts"] >= 2  # Ray ran the task again, on the node left

    def test_every_row_is_published_to_s3_exactly_once(self, killed_run: dict[str, Any]) -> None:
        run = killed_run["commands"][0]
        assert run["returncode"] == 0, run["stderr"][-3000:]
        for k in range(NUM_SHARDS):
            assert f"ray: shard {k}/{NUM_SHARDS} succeeded" in run["stderr"]
        assert killed_run["s3_keys"] == [
            f"out/shard-{k}-of-{NUM_SHARDS}.jsonl" for k in range(NUM_SHARDS)
        ]  # whole shards only: no part object left under any name
        rows = published(killed_run["root"] / "s3" / "out")
        assert [int(r["row"]) for r in rows] == list(range(ROWS))  # none lost, none twice
        assert all(r["__errors__"] is None for r in rows)
        assert [r["answer"] for r in rows] == [f"echo: {prompt_of(i)}" for i in range(ROWS)]
        check = killed_run["commands"][1]
        assert check["returncode"] == 0 and check["requests"] == 0, check["stderr"][-2000:]

    def test_no_answer_that_came_back_is_paid_twice(self, killed_run: dict[str, Any]) -> None:
        """Each distinct request is asked once, except those in flight when the node died."""
        print(assert_asked_once_but_in_flight(killed_run))  # the note's figures (pytest -s)

    def test_no_file_holds_a_key_or_a_storage_secret(self, killed_run: dict[str, Any]) -> None:
        """The nodes were started without either: the tasks had them from the driver."""
        assert killed_run["commands"][0]["returncode"] == 0
        assert killed_run["files_with_key"] == []
        assert killed_run["files_with_s3_secret"] == []


# -- without a cluster -------------------------------------------------------------------------


def test_a_task_gets_the_storage_variables_of_s3_datasets_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What travels to a Ray task: the variables ``storage_options`` names and boto's own
    (``AWS_*``) for a dataset on s3://; for local datasets, neither."""
    from mmirage.config import load_mmirage_config_dict
    from mmirage.executors.ray_env import forwarded_env

    for name, value in s3_support.variables("http://127.0.0.1:9").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-ray-test")
    dataset = {
        "path": f"s3://{BUCKET}/in/rows.jsonl",
        "type": "JSONL",
        "output_dir": f"s3://{BUCKET}/out",
        "storage_options": s3_support.OPTIONS,
    }
    on_s3 = yaml.safe_load(pipeline(Path("x"), state_dir=Path("state"), dataset=dataset))
    local = yaml.safe_load(pipeline(Path("x"), state_dir=Path("state")))
    sent = forwarded_env(load_mmirage_config_dict(on_s3))
    assert {"MMI_S3_KEY", "MMI_S3_SECRET", "MMI_S3_ENDPOINT", "AWS_REGION"} <= set(sent)
    assert sent["MMI_S3_SECRET"] == s3_support.SECRET
    kept = set(forwarded_env(load_mmirage_config_dict(local)))
    assert "OPENAI_API_KEY" in kept and not kept & {"MMI_S3_SECRET", "AWS_REGION"}
