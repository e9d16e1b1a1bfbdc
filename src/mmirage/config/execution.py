"""``execution_params``: local or SLURM, retry and merge policy, SLURM job settings."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
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
