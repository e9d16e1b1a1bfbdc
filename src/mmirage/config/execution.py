"""``execution_params``: local or SLURM, retry and merge policy, SLURM job settings."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Literal

from mmirage.config.errors import FieldError
from mmirage.config.fields import (
    NonEmptyStr,
    NonNegativeFloat,
    NonNegativeInt,
    OptionalPathStr,
    PathStr,
    PositiveFloat,
    PositiveInt,
)

# SLURM --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_SLURM_TIME = re.compile(r"^(\d+-\d+(:\d{1,2}){0,2}|\d+(:\d{1,2}){0,2})$")
# What would let a value break out of the job script it is written into.
_UNSAFE_IN_SCRIPT = re.compile(r"[\n\r`]|\$\(")
# Fields written into the SLURM job script as values.
_SCRIPT_FIELDS = (
    "project_root",
    "report_dir",
    "hf_home",
    "edf_env",
    "account",
    "job_name",
    "reservation",
    "time_limit",
    "partition",
    "qos",
    "mem",
    "constraint",
)


@dataclass
class ExecutionParams:
    mode: Literal["local", "slurm"] = "local"
    retry: bool = False
    merge: bool = False
    max_retries: NonNegativeInt = 3
    poll_interval_seconds: PositiveFloat = 30
    settle_time_seconds: NonNegativeFloat = 60
    project_root: OptionalPathStr = None
    report_dir: PathStr = "~/reports"
    hf_home: PathStr = "~/hf"
    edf_env: OptionalPathStr = None
    account: str | None = None
    job_name: NonEmptyStr = "mmirage-sharded"
    reservation: str | None = None
    nodes: PositiveInt = 1
    ntasks_per_node: PositiveInt = 1
    gpus: NonNegativeInt = 4
    cpus_per_task: PositiveInt = 288
    time_limit: str = "11:59:59"
    partition: str | None = None
    qos: str | None = None
    mem: str | None = None  # sbatch --mem, e.g. 64G
    constraint: str | None = None
    max_concurrent_tasks: PositiveInt | None = None  # the array's %N throttle
    sbatch_args: list[str] = field(default_factory=list)  # passed to sbatch as written
    setup: list[str] = field(default_factory=list)  # shell lines run first in each task
    # A task about to hit its time limit gets SIGTERM this long before: it checkpoints, records
    # "time limit" and exits, and its retry resumes from the checkpoint.
    signal_grace_seconds: PositiveInt = 120
    # New: how many shards ``mmirage run`` runs at once in local mode (each in its own process).
    # The original ran them one after another; 1 keeps that.
    local_parallel_shards: PositiveInt = 1

    def __post_init__(self) -> None:
        # Defaults are written with "~" too; expand them like user values.
        self.report_dir = os.path.expanduser(self.report_dir)
        self.hf_home = os.path.expanduser(self.hf_home)
        self.reservation = self.reservation or None
        self.account = self.account or None
        if self.mode == "slurm" and not self.account:
            raise FieldError("account", "is required when mode is 'slurm'")
        if not _SLURM_TIME.match(self.time_limit.strip()):
            raise FieldError(
                "time_limit",
                f"must be a SLURM time such as HH:MM:SS or D-HH:MM:SS, got {self.time_limit!r}",
            )
        if self.edf_env and not os.path.isfile(self.edf_env):
            raise FieldError("edf_env", f"EDF environment file not found: {self.edf_env}")
        if self.mode == "slurm":
            self._check_slurm_values()

    def _check_slurm_values(self) -> None:
        for name in _SCRIPT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str) and _UNSAFE_IN_SCRIPT.search(value):
                raise FieldError(name, _unsafe(value))
        for index, value in enumerate(self.sbatch_args):
            if _UNSAFE_IN_SCRIPT.search(value):
                raise FieldError(f"sbatch_args[{index}]", _unsafe(value))
        for index, line in enumerate(self.setup):
            # Setup lines are shell on purpose ($(...) is fine); each entry stays one line.
            if "\n" in line or "\r" in line:
                raise FieldError(
                    f"setup[{index}]", "must be one line: give each line its own entry"
                )
        # One task per shard: more nodes or tasks would run the same shard twice at once.
        for name in ("nodes", "ntasks_per_node"):
            if getattr(self, name) != 1:
                raise FieldError(
                    name,
                    "must be 1: each array task runs one shard on one node (raise "
                    "loading_params.num_shards to use more nodes)",
                )


def _unsafe(value: str) -> str:
    return (
        f"{value!r} would break the SLURM job script (a newline, a backtick or '$(' in it); "
        "write the value without them"
    )
