"""The SLURM job script, rendered from execution_params: golden files, one per shape, and the
values refused at load because they would break the script."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mmirage.config.errors import ConfigError
from mmirage.config.execution import ExecutionParams
from mmirage.config.reader import load_mmirage_config_dict
from mmirage.executors.slurm_client import parse_rows
from mmirage.executors.slurm_script import JobSpec, array_spec, render_job_script, task_log

GOLDEN = Path(__file__).parent / "golden" / "slurm"
SPEC = JobSpec(
    config_path=Path("/data/pipelines/caption.yaml"),
    shard_ids=(0, 1, 2, 3),
    workdir=Path("/data/pipelines"),
    python="/opt/venv/bin/python",
)

EVERY_FIELD: dict[str, Any] = {
    "mode": "slurm",
    "account": "a-proj",
    "reservation": "hackathon",
    "partition": "normal",
    "qos": "high",
    "mem": "64G",
    "constraint": "gpu&h100",
    "job_name": "caption-all",
    "report_dir": "/scratch/reports",
    "hf_home": "/scratch/hf",
    "gpus": 4,
    "cpus_per_task": 72,
    "time_limit": "1-00:00:00",
    "max_concurrent_tasks": 16,
    "signal_grace_seconds": 300,
    "sbatch_args": ["--exclusive", "--mail-type=END"],
    "setup": ["module load cuda/12.4", "source /opt/venv/bin/activate"],
}

CASES: dict[str, tuple[dict[str, Any], JobSpec]] = {
    "defaults": ({"mode": "slurm", "account": "a-proj", "report_dir": "/r", "hf_home": "/h"}, SPEC),
    "every_field": (EVERY_FIELD, SPEC),
    "cpu_only_retry_of_three_shards": (
        {"mode": "slurm", "account": "a-proj", "gpus": 0, "report_dir": "logs", "hf_home": "/h"},
        JobSpec(SPEC.config_path, (7, 1, 3), SPEC.workdir, SPEC.python, log_level="DEBUG"),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_job_script_matches_its_golden_file(name: str, tmp_path: Path) -> None:
    fields, spec = CASES[name]
    edf = None
    if name == "every_field":
        edf = tmp_path / "env.toml"  # edf_env must exist: the golden file shows a fixed path
        edf.write_text("image = 'x'\n")
        fields = {**fields, "edf_env": str(edf)}
    script = render_job_script(ExecutionParams(**fields), spec)
    if edf is not None:
        script = script.replace(str(edf), "/etc/edf/env.toml")
    golden = GOLDEN / f"{name}.sh"
    if os.environ.get("MMIRAGE_UPDATE_GOLDEN"):
        golden.write_text(script)
    assert script == golden.read_text()


def test_array_spec_ranges_lists_and_throttle() -> None:
    assert array_spec([3, 0, 1, 2], None) == "0-3"
    assert array_spec([7, 1, 3], 2) == "1,3,7%2"
    assert array_spec([5], None) == "5"
    with pytest.raises(ValueError):
        array_spec([], None)


def test_relative_report_dir_is_under_the_workdir() -> None:
    ep = ExecutionParams(mode="slurm", account="a", report_dir="logs")
    assert task_log(ep, Path("/w"), "job", "42", 3) == "/w/logs/R-job.42_3.err"


def _execution_error(fields: dict[str, Any]) -> str:
    data = {
        "processors": [{"type": "custom", "script_path": __file__, "function_name": "f"}],
        "loading_params": {"datasets": [{"path": "d.jsonl", "type": "JSONL", "output_dir": "o"}]},
        "processing_params": {
            "inputs": [{"name": "t", "key": "t"}],
            "outputs": [{"name": "x", "type": "custom"}],
            "output_schema": {"x": "{{ x }}"},
        },
        "execution_params": {"mode": "slurm", "account": "a", **fields},
    }
    with pytest.raises(ConfigError) as caught:
        load_mmirage_config_dict(data, source="c.yaml", env={})
    return str(caught.value)


@pytest.mark.parametrize(
    ("fields", "where"),
    [
        ({"account": "a`reboot`"}, "execution_params.account"),
        ({"partition": "p$(rm -rf ~)"}, "execution_params.partition"),
        ({"job_name": "two\nlines"}, "execution_params.job_name"),
        ({"sbatch_args": ["--comment=$(id)"]}, "execution_params.sbatch_args[0]"),
    ],
)
def test_values_that_would_break_the_script_are_refused(fields: dict[str, Any], where: str) -> None:
    message = _execution_error(fields)
    assert where in message and "would break the SLURM job script" in message


def test_setup_lines_may_use_the_shell_but_stay_one_line() -> None:
    ep = ExecutionParams(mode="slurm", account="a", setup=["export N=$(nproc)"])
    assert "export N=$(nproc)" in render_job_script(ep, SPEC)
    assert "setup[0]: must be one line" in _execution_error({"setup": ["a\nb"]})


@pytest.mark.parametrize("field", ["nodes", "ntasks_per_node"])
def test_more_than_one_node_or_task_is_refused(field: str) -> None:
    message = _execution_error({field: 2})
    assert f"execution_params.{field}: must be 1" in message and "num_shards" in message


def test_squeue_and_sacct_rows_parse_to_tasks() -> None:
    rows = parse_rows(
        [
            "12_3|RUNNING|0:05|None",
            "12_[4-6,9%2]|PENDING||Priority",
            "12_1|CANCELLED by 0|0:01|",
            "12_1.batch|CANCELLED|0:01|",  # a step, not a task
            "13|COMPLETED|0:01|",  # not an array
        ]
    )
    assert sorted(rows) == [("12", k) for k in (1, 3, 4, 5, 6, 9)]
    assert rows[("12", 1)].state == "CANCELLED" and not rows[("12", 1)].active
    assert rows[("12", 5)].state == "PENDING" and rows[("12", 5)].active
