"""One shard as a Ray task: the same ``run_one`` as a local or SLURM shard (checkpoints, resume,
answer store), given the driver's run value.

Ray runs a task again only when the attempt before it died with its worker or its node. That
attempt left the shard ``running`` in status.json; a dead process on another host is only
seen as stale after minutes, so the retry, finding its own task id in ``ray_task.json``, marks
the dead attempt failed and resumes from its checkpoint at once: the rows it had published are
kept and the answers it had stored are not paid for again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.errors import UserError
from mmirage.executors.base import RunPlan
from mmirage.executors.outcome import ShardOutcome
from mmirage.rundir import RunDir, atomic_write_json

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

TASK_FILE = "ray_task.json"  # in the shard's state folder: the Ray task and node running it


def run_shard_task(
    cfg: MMirageConfig,
    run_dir: RunDir,
    shard_id: int,
    plan: RunPlan,
    run_id: str,
    cwd: str,
    env: dict[str, str],
) -> ShardOutcome:
    """The body of a shard's Ray task, run on a node of the cluster, with the driver's ``env``
    (``ray_env``); its outcome."""
    from llm_kit.errors import ConfigError as KitConfigError
    from mmirage.executors.local import run_one
    from mmirage.executors.ray_cluster import import_ray
    from mmirage.executors.ray_env import task_env

    ray = import_ray()
    context = ray.get_runtime_context()
    task_id, node_id = str(context.get_task_id()), str(context.get_node_id())
    # Relative paths in the config mean what they meant where `mmirage run` was started.
    with _working_dir(cwd), task_env(env):
        release_dead_attempt(run_dir, shard_id, task_id)
        record_task(run_dir, shard_id, task_id, node_id)
        try:
            return run_one(
                on_task_gpus(cfg, len(ray.get_gpu_ids())), run_dir, shard_id, plan, run_id
            )
        except (UserError, KitConfigError) as exc:
            return ShardOutcome(shard_id, problem=str(exc), user_error=True)
        except SystemExit as exc:  # a stop: the shard recorded it and resumes on the next run
            return ShardOutcome(shard_id, problem=f"interrupted (exit status {exc.code})")


def record_task(run_dir: RunDir, shard_id: int, task_id: str, node_id: str) -> None:
    atomic_write_json(
        run_dir.shard_dir(shard_id) / TASK_FILE,
        {"task_id": task_id, "node_id": node_id, "pid": os.getpid()},
    )


def release_dead_attempt(run_dir: RunDir, shard_id: int, task_id: str) -> bool:
    """Mark the shard failed when an earlier attempt of this same task left it ``running``:
    Ray retries a task only after that attempt died. Whether it did."""
    from mmirage.core.shard.state import FAILED, RUNNING, read_status

    recorded = _read_json(run_dir.shard_dir(shard_id) / TASK_FILE)
    status = read_status(run_dir.status_path(shard_id)) or {}
    if recorded.get("task_id") != task_id or status.get("status") != RUNNING:
        return False
    node = str(recorded.get("node_id") or "?")
    status.update(
        {
            "status": FAILED,
            "error": f"its Ray task died with its worker or node (node {node[:12]})",
        }
    )
    atomic_write_json(run_dir.status_path(shard_id), status)
    return True


def on_task_gpus(cfg: MMirageConfig, gpus: int) -> MMirageConfig:
    """``cfg`` whose launched engines (``server_args``) use the task's ``gpus`` GPUs: a
    ``tp_size`` left at its default of 1 becomes their number (Ray has set
    ``CUDA_VISIBLE_DEVICES`` to them, so one engine per task runs on the task's GPUs)."""
    if gpus <= 1:
        return cfg
    processors: list[Any] = []
    for processor in cfg.processors:
        args = getattr(processor, "server_args", None)
        if args is not None and args.tp_size == 1:
            args = dataclasses.replace(args, tp_size=gpus)
            processor = dataclasses.replace(processor, server_args=args)
        processors.append(processor)
    return dataclasses.replace(cfg, processors=processors)


@contextlib.contextmanager
def _working_dir(cwd: str) -> Any:
    # A Ray worker runs many tasks: the driver's folder only for this one, when the node has it.
    if not os.path.isdir(cwd):
        yield
        return
    with contextlib.chdir(cwd):
        yield


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
