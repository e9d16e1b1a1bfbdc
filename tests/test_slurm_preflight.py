"""A SLURM submission checks what a local run checks, before ``sbatch``, with the same
sentences: a missing dataset, image folder or key is found here, not by a task that waited in
the queue (before: the task failed, after sbatch)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from test_slurm import make_pipeline


def mmirage(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def broken(root: Path, what: str) -> tuple[Path, dict[str, str]]:
    config = make_pipeline(root, "http://127.0.0.1:9/v1", shards=1, name=f"preflight-{what}")
    data: dict[str, Any] = yaml.safe_load(config.read_text())
    env = {**os.environ, "OPENAI_API_KEY": "sk-preflight"}
    dataset = data["loading_params"]["datasets"][0]
    if what == "dataset":
        dataset["path"] = str(root / "gone.jsonl")
    elif what == "image_folder":
        dataset["image_base_path"] = str(root / "no-images")
    elif what == "key":
        processor = data["processors"][0]
        processor.pop("base_url")  # the hosted API: its key is needed
        processor["message_format"] = "openai"
        env.pop("OPENAI_API_KEY")
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    return config, env


SAYS = {
    "dataset": "loading_params.datasets[0].path = '{root}/gone.jsonl'): no such file",
    "image_folder": "image_base_path = '{root}/no-images' is not a folder",
    "key": "OPENAI_API_KEY",
}


@pytest.mark.parametrize("what", list(SAYS))
def test_slurm_submission_checks_what_a_local_run_checks(
    what: str, slurm_cluster: None, tmp_path: Path
) -> None:
    config, env = broken(tmp_path, what)
    submitted = mmirage("run", str(config), cwd=tmp_path, env=env)
    assert submitted.returncode == 2, submitted.stderr
    assert SAYS[what].format(root=tmp_path) in submitted.stderr, submitted.stderr
    assert submitted.stdout == "" and "submitted SLURM job" not in submitted.stderr
    assert not list(tmp_path.glob("state/pipeline-*/slurm/job-*.sh"))  # nothing was submitted

    data = yaml.safe_load(config.read_text())
    data["execution_params"]["mode"] = "local"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    local = mmirage("run", str(config), cwd=tmp_path, env=env)
    assert local.returncode == 2
    line = next(ln for ln in submitted.stderr.splitlines() if ln.startswith("error:"))
    assert line in local.stderr  # the same sentence
