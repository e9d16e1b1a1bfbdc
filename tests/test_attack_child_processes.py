"""The processes a run starts: shard children and SLURM tasks never import code from the working
directory, and a SLURM command that hangs costs a bounded wait, not minutes per call.

A ``click.py`` beside the config stands for any stray module there (an attacker's, or a user's
``json.py``): before the fix every shard child and every SLURM task executed it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mmirage.executors.slurm_client import SlurmClient, SlurmUnavailableError, run_bounded
from test_parallel_shards import parallel_config
from test_retry_cli import published_keys
from test_slurm import ROWS, make_pipeline, rows_of

# Leaves a mark and breaks the import: a process that ran it cannot go on quietly.
STRAY_CLICK = (
    "import os, pathlib\n"
    "pathlib.Path(__file__).with_name(f'ran-stray-click.{os.getpid()}').touch()\n"
    "raise ImportError('the stray click.py of the working directory was imported')\n"
)


def isolated_mmirage(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """The CLI as its console script starts it: the parent itself never sees ``cwd``'s files,
    so whatever imports the stray module is a process that the run started."""
    return subprocess.run(
        [sys.executable, "-P", "-m", "mmirage", *args],
        cwd=cwd,
        env={**os.environ, "OPENAI_API_KEY": "sk-child-test", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def marks(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("ran-stray-click.*"))


def test_parallel_shard_children_do_not_import_the_working_directory(tmp_path: Path) -> None:
    config = parallel_config(tmp_path, width=2)
    (tmp_path / "click.py").write_text(STRAY_CLICK)
    ran = isolated_mmirage("run", str(config), cwd=tmp_path, env={"CALL_LOG": str(tmp_path / "l")})
    assert marks(tmp_path) == []
    assert ran.returncode == 0, ran.stderr
    assert len(published_keys(tmp_path, 4)) == 12


def test_a_slurm_task_does_not_import_its_project_root(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "click.py").write_text(STRAY_CLICK)
    config = make_pipeline(
        tmp_path,
        emulator.openai_base_url,
        shards=1,
        name="isolated",
        execution={"project_root": str(root)},
    )
    done = isolated_mmirage("run", str(config), "--wait", cwd=tmp_path)
    assert marks(root) == []
    assert done.returncode == 0, done.stderr
    assert len(rows_of(tmp_path)) == ROWS
    (script,) = (tmp_path / "state").glob("pipeline-*/slurm/job-*.sh")
    assert f"{sys.executable} -P -m mmirage" in script.read_text()


def hanging(shim: Path, program: str) -> None:
    """``program`` on PATH that never answers, through a child that holds its pipes open
    (as a wrapper script around a stuck SLURM client does)."""
    shim.mkdir(exist_ok=True)
    (shim / program).write_text("#!/bin/bash\nsleep 600 &\nwait\n")
    (shim / program).chmod(0o755)


def test_a_command_that_hangs_is_killed_with_the_children_holding_its_pipes(
    tmp_path: Path,
) -> None:
    hanging(tmp_path, "stuck")
    done = run_bounded([str(tmp_path / "stuck")], 1.0)
    assert done.returncode == 124 and "no answer within 1 s" in done.stderr
    left = subprocess.run(["pgrep", "-f", f"{tmp_path}/stuck"], capture_output=True, text=True)
    assert left.stdout == ""  # the whole session was killed, the sleeping child included


def test_a_hanging_squeue_gives_up_within_the_budget(tmp_path: Path) -> None:
    hanging(tmp_path, "squeue")
    client = SlurmClient(budget_s=4, call_timeout_s=1)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{tmp_path}:{path}"
    try:
        with pytest.raises(SlurmUnavailableError, match=r"^squeue failed \d times in 4 s \("):
            client.tasks(["123"])
    finally:
        os.environ["PATH"] = path


@pytest.mark.slow  # waits out the 30 s budget twice; the budget is in the 4 s test above
def test_check_and_wait_end_with_one_sentence_when_squeue_hangs(
    slurm_cluster: None, emulator: Any, tmp_path: Path
) -> None:
    config = make_pipeline(tmp_path, emulator.openai_base_url, shards=1, name="hang")
    submitted = isolated_mmirage("run", str(config), cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    shim = tmp_path / "bin"
    hanging(shim, "squeue")
    hanging(shim, "sacct")
    env = {"PATH": f"{shim}:{os.environ['PATH']}"}
    # Before: 6 calls of 60 s each and their backoff (392 s). The subprocess timeout is the
    # bound: the budget is about 30 s.
    check = isolated_mmirage("check", str(config), cwd=tmp_path, env=env, timeout=120)
    assert check.returncode == 1
    assert "squeue failed" in check.stderr and "in 30 s" in check.stderr
    assert "the jobs keep running" in check.stderr and "Traceback" not in check.stderr
    (tmp_path / "waits").mkdir()
    other = make_pipeline(tmp_path / "waits", emulator.openai_base_url, shards=1, name="hang2")
    waited = isolated_mmirage("run", str(other), "--wait", cwd=tmp_path, env=env, timeout=120)
    assert waited.returncode == 1 and "squeue failed" in waited.stderr, waited.stderr
