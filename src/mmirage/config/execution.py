"""``execution_params``: local, SLURM or Ray, retry and merge policy, SLURM job and Ray task
settings."""

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
from mmirage.config.ray_settings import RayParams

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
    """``execution_params``: where the shards run (here, as a SLURM array or as Ray tasks), how
    failed shards are retried, whether the results are merged, and the SLURM job's and the Ray
    tasks' settings."""

    mode: Literal["local", "slurm", "ray"] = "local"
    """`local`: `mmirage run` runs the shards on this machine; `slurm`: it submits them as one
    SLURM array (one task per shard) and prints the job id; `ray`: it runs each shard as a task
    on a Ray cluster (`ray`) and waits for them all."""
    retry: bool = False
    """Retry a failed shard up to `max_retries` times within `mmirage run` (in slurm mode:
    follow the array and resubmit failed shards)."""
    merge: bool = False
    """Once every shard has succeeded, merge each dataset's shards into `<output_dir>/merged`,
    as `mmirage merge` would (in slurm mode, `mmirage run` then follows the array)."""
    max_retries: NonNegativeInt = 3
    """Retries a shard gets after its first attempt, in all (`run`, `retry` and resubmissions
    together; counted in its `status.json`)."""
    poll_interval_seconds: PositiveFloat = 30
    """Seconds between polls when following a SLURM array (`squeue`) or waiting for provider
    batches (`check --wait`, `merge --wait`)."""
    settle_time_seconds: NonNegativeFloat = 60
    """Slurm mode: seconds to wait after the array's tasks leave the queue, for their last
    status writes to reach a shared filesystem."""
    project_root: OptionalPathStr = None
    """Slurm mode: the tasks' working directory (`--chdir`), against which a relative
    `report_dir` is resolved. Unset: where the job was submitted from."""
    report_dir: PathStr = "~/reports"
    """Slurm mode: where the tasks' logs go, `R-<job_name>.<job id>_<task>.out` / `.err`
    (relative to `project_root`)."""
    hf_home: PathStr = "~/hf"
    """Slurm mode: exported as `HF_HOME` in every task (the Hugging Face cache)."""
    edf_env: OptionalPathStr = None
    """Slurm mode: an EDF environment file (CSCS/Pyxis); the task then runs under
    `srun --environment=<edf_env>`. Must exist when set; empty means unset."""
    account: str | None = None
    """The SLURM account (`--account`); required in slurm mode."""
    job_name: NonEmptyStr = "mmirage-sharded"
    """The SLURM job name (`--job-name`), also in the log file names."""
    reservation: str | None = None
    """A SLURM reservation (`--reservation`). Unset or empty: none."""
    nodes: PositiveInt = 1
    """Nodes per task (`--nodes`); must be 1: each array task runs one shard on one node (raise
    `loading_params.num_shards` to use more nodes)."""
    ntasks_per_node: PositiveInt = 1
    """`--ntasks-per-node`; must be 1, for the same reason as `nodes`."""
    gpus: NonNegativeInt = 4
    """GPUs per task (`--gres=gpu:N`); 0 writes no `--gres` line."""
    cpus_per_task: PositiveInt = 288
    """CPUs per task (`--cpus-per-task`)."""
    time_limit: str = "11:59:59"
    """Each task's time limit (`--time`), a SLURM time such as `HH:MM:SS` or `D-HH:MM:SS`."""
    partition: str | None = None
    """The SLURM partition (`--partition`). Unset: the cluster's default."""
    qos: str | None = None
    """The SLURM quality of service (`--qos`). Unset: the default."""
    mem: str | None = None
    """Memory per node (`sbatch --mem`), e.g. `64G`. Unset: the cluster's default."""
    constraint: str | None = None
    """Node features the tasks need (`--constraint`)."""
    max_concurrent_tasks: PositiveInt | None = None
    """At most this many tasks of the array run at once (the array's `%N` throttle). Unset: no
    throttle."""
    sbatch_args: list[str] = field(default_factory=list)
    """More `#SBATCH` options, passed to sbatch as written (e.g. `--exclusive`)."""
    setup: list[str] = field(default_factory=list)
    """Shell lines each task runs first (e.g. `module load ...`, activating a virtual
    environment); one line per entry."""
    signal_grace_seconds: PositiveInt = 120
    """Slurm mode: a task about to hit its time limit gets SIGTERM this many seconds before; it
    stops as at `stop_grace_seconds` (until 20 s before the end at the latest), records "time
    limit" and exits, and its retry resumes from the checkpoint."""
    stop_grace_seconds: NonNegativeFloat = 20
    """How long a stopped run waits for its requests in flight. The first Ctrl-C or SIGTERM
    (`kill`, `scancel`, a job manager) stops sending, lets the requests under way come back for
    up to this many seconds (they are paid for: their answers are kept, and the rerun does not
    ask for them again), then exits 130 (Ctrl-C) or 143 (SIGTERM); a second signal stops at
    once. 0: stop at once. In a SLURM task at most the cluster's KillWait less 5 s (a quarter
    of a KillWait under 20 s; 25 s at SLURM's default of 30 s): SLURM follows its SIGTERM
    (`scancel`, the time limit) with SIGKILL after KillWait, and the task must record its state
    before that."""
    local_parallel_shards: PositiveInt = 1
    """Local mode: how many shards `mmirage run` runs at once, each in its own process; 1 runs
    them one after another."""
    ray: RayParams = field(default_factory=RayParams)
    """Ray mode: the cluster and what each shard's task reserves on it."""
    progress_interval_seconds: PositiveFloat = 30
    """When stderr is not a terminal (a SLURM task's log, `nohup`, `> log 2>&1`): seconds
    between two progress lines (rows done/total, rows/s, ETA, failed, retried, rate-limited,
    tokens, cost so far). A terminal gets a live bar with the same counters instead."""

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
