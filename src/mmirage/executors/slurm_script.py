"""The SLURM job script of a submission: an array with one task per shard, each task running
``<this interpreter> -P -m mmirage run <config> --shard-id $SLURM_ARRAY_TASK_ID``.

Everything is in ``#SBATCH`` lines, so the file written to the state folder is exactly what ran
(``sbatch --parsable FILE``); a pip install is enough on the nodes, no source checkout.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mmirage.config.execution import ExecutionParams
from mmirage.core.shard.stop import DEADLINE_ENV, KILL_WAIT_ENV, slurm_seconds

# The task records "time limit" on this signal (see ``signal_grace_seconds``). A scancel sends
# SIGTERM too: either way the task drains its requests in flight, then exits (``stop``).
TIME_LIMIT_SIGNAL = "TERM"
# The cluster's KillWait (the time between SLURM's SIGTERM and its SIGKILL), which bounds the
# task's drain; empty when scontrol cannot say (the task then assumes SLURM's default, 30 s).
_KILL_WAIT = "$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\\([0-9]*\\).*/\\1/p')"


@dataclass(frozen=True)
class JobSpec:
    """What one submission runs: which config, which shards, from where, with what."""

    config_path: Path  # absolute
    shard_ids: Sequence[int]
    workdir: Path  # --chdir: project_root, else where the submission ran
    python: str = sys.executable
    log_level: str = "WARNING"
    command: str = "run"  # or "retry": also computes again a finished shard's retryable rows
    env: tuple[tuple[str, str], ...] = ()  # exported to each task (``forwarding.shard_env``)
    # After the config path: the submitting run's id and flags (``--recompute``, ``--fresh``),
    # so that a requeued task resumes that run's work (``runner.FORCED_BY``).
    args: tuple[str, ...] = ()


def array_spec(shard_ids: Sequence[int], max_concurrent: int | None) -> str:
    """``0-7`` for a contiguous run of shards, ``1,3,7`` otherwise; ``%N`` throttles."""
    ids = sorted(set(shard_ids))
    if not ids:
        raise ValueError("a SLURM array needs at least one shard")
    contiguous = ids == list(range(ids[0], ids[-1] + 1))
    spec = f"{ids[0]}-{ids[-1]}" if contiguous and len(ids) > 1 else ",".join(map(str, ids))
    return f"{spec}%{max_concurrent}" if max_concurrent else spec


def log_paths(ep: ExecutionParams, workdir: Path) -> tuple[str, str]:
    """The tasks' stdout and stderr patterns (``R-<job name>.<job id>_<task>.out/.err``)."""
    report_dir = Path(ep.report_dir)
    if not report_dir.is_absolute():
        report_dir = workdir / report_dir
    stem = os.path.join(report_dir, "R-%x.%A_%a")
    return f"{stem}.out", f"{stem}.err"


def task_log(ep: ExecutionParams, workdir: Path, job_name: str, job_id: str, task: int) -> str:
    """Where task ``task`` of job ``job_id`` writes its stderr (what check shows a user)."""
    pattern = log_paths(ep, workdir)[1]
    return pattern.replace("%x", job_name).replace("%A", job_id).replace("%a", str(task))


def _directives(ep: ExecutionParams, spec: JobSpec) -> list[str]:
    out, err = log_paths(ep, spec.workdir)
    options: list[tuple[str, object]] = [
        ("job-name", ep.job_name),
        ("array", array_spec(spec.shard_ids, ep.max_concurrent_tasks)),
        ("chdir", spec.workdir),
        ("output", out),
        ("error", err),
        # A requeued (preempted) task appends to its logs instead of wiping them.
        ("open-mode", "append"),
        ("nodes", ep.nodes),
        ("ntasks-per-node", ep.ntasks_per_node),
        ("cpus-per-task", ep.cpus_per_task),
        ("time", ep.time_limit.strip()),
        ("signal", f"B:{TIME_LIMIT_SIGNAL}@{ep.signal_grace_seconds}"),
        ("account", ep.account),
        ("reservation", ep.reservation),
        ("partition", ep.partition),
        ("qos", ep.qos),
        ("mem", ep.mem),
        ("constraint", ep.constraint),
        ("gres", f"gpu:{ep.gpus}" if ep.gpus > 0 else None),
    ]
    lines = [f"#SBATCH --{name}={value}" for name, value in options if value is not None]
    lines.append("#SBATCH --requeue")
    lines += [f"#SBATCH {arg}" for arg in ep.sbatch_args]
    return lines


def task_command(ep: ExecutionParams, spec: JobSpec) -> str:
    # -P: the task's --chdir (project_root) holds the user's files, never code to import.
    argv = [
        spec.python,
        "-P",
        "-m",
        "mmirage",
        "--log-level",
        spec.log_level,
        spec.command,
        str(spec.config_path),
        *spec.args,
    ]
    command = " ".join(shlex.quote(a) for a in argv) + ' --shard-id "$SLURM_ARRAY_TASK_ID"'
    if ep.edf_env:
        # CSCS/Pyxis: the task runs inside the EDF container.
        launcher = f"srun --environment={shlex.quote(ep.edf_env)}"
        return f"exec {launcher} {command}"
    # exec: the interpreter itself gets the time-limit signal (--signal=B: signals the batch shell).
    return f"exec {command}"


def render_job_script(ep: ExecutionParams, spec: JobSpec) -> str:
    """The whole job script for ``spec`` under ``ep``."""
    lines = [
        "#!/bin/bash",
        "# Written by mmirage: one array task per shard. Submitted with `sbatch --parsable FILE`.",
        *_directives(ep, spec),
        "set -eo pipefail",  # no -u: module and venv activate scripts read unset variables
        # When SLURM ends the task (counted from its start, before setup takes its time): its
        # SIGTERM near then is recorded as "time limit".
        f"export {DEADLINE_ENV}=$(( $(date +%s) + {slurm_seconds(ep.time_limit)} ))",
        f"export {KILL_WAIT_ENV}={_KILL_WAIT}",
        *ep.setup,
        f"export HF_HOME={shlex.quote(ep.hf_home)}",
        *(f"export {name}={shlex.quote(value)}" for name, value in spec.env),
        task_command(ep, spec),
    ]
    return "\n".join(lines) + "\n"
