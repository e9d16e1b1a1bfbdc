"""``execution_params.mode`` → the executor class that runs the shards in that mode."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mmirage.executors.base import Executor
from mmirage.executors.local import LocalExecutor
from mmirage.executors.ray_run import RayExecutor
from mmirage.executors.slurm_run import SlurmExecutor

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

EXECUTORS: dict[str, type[Executor]] = {
    "local": LocalExecutor,
    "slurm": SlurmExecutor,
    "ray": RayExecutor,  # imports Ray only when it runs (the ray extra)
}
HERE = "local"  # a shard named on the command line (a SLURM task, a child shard) runs here


def register_executor(mode: str, executor: type[Executor]) -> None:
    EXECUTORS[mode] = executor


def executor_for(cfg: MMirageConfig, config_path: Path, run_id: str, *, here: bool) -> Executor:
    mode = HERE if here else cfg.execution_params.mode
    return EXECUTORS[mode](cfg, config_path, run_id)
