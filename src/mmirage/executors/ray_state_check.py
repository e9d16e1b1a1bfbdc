"""Before a ``mode: ray`` run pays for anything: every node of the cluster must see the state
folder the driver sees (checkpoints, answer store and status live there, and a retried task
resumes from them on another node). The driver writes a token there; one task per node reads it
back; a node that cannot stops the run with one sentence naming the node and the path."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from types import ModuleType
from typing import Any

from mmirage.errors import UserError
from mmirage.rundir import RunDir, atomic_write_json

CHECK_DIR = "ray"  # under the pipeline's state folder
ANSWER_WITHIN_S = 120.0  # a node that has not run the check by then is stuck


def read_token(path: str, cwd: str) -> str | None:
    """On a node: the token at ``path`` (relative paths from the driver's folder), or
    ``None`` when this node cannot read it."""
    import json

    where = path if os.path.isabs(path) or not os.path.isdir(cwd) else os.path.join(cwd, path)
    try:
        return str(json.loads(Path(where).read_text(encoding="utf-8"))["token"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_nodes_see_state(ray: ModuleType, run_dir: RunDir) -> int:
    """One task on each alive node reads the token the driver wrote under ``run_dir.state``;
    the number of nodes checked (a node that left the cluster meanwhile is not one).
    ``UserError`` naming the first node that cannot read it."""
    import importlib

    strategies = importlib.import_module("ray.util.scheduling_strategies")
    token = secrets.token_hex(8)
    marker = run_dir.state / CHECK_DIR / f"state-check-{token}.json"
    atomic_write_json(marker, {"token": token})
    reader = ray.remote(read_token)
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    checks = [
        reader.options(
            num_cpus=0,
            scheduling_strategy=strategies.NodeAffinitySchedulingStrategy(
                node["NodeID"], soft=False
            ),
        ).remote(str(marker), os.getcwd())
        for node in nodes
    ]
    checked = 0
    try:
        for node, check in zip(nodes, checks, strict=True):
            try:
                seen = ray.get(check, timeout=ANSWER_WITHIN_S)
            except ray.exceptions.GetTimeoutError:
                raise UserError(_no_answer(node)) from None
            except (ray.exceptions.TaskUnschedulableError, ray.exceptions.NodeDiedError):
                continue  # the node left the cluster meanwhile: it will run no task
            if seen != token:
                raise UserError(_cannot_read(node, marker))
            checked += 1
    finally:
        with contextlib.suppress(OSError):
            marker.unlink()
    return checked


def _no_answer(node: dict[str, Any]) -> str:
    name = node.get("NodeName") or node.get("NodeManagerAddress") or "?"
    return (
        f"Ray node {name} ({str(node.get('NodeID'))[:12]}) did not run the check of the state "
        f"folder within {ANSWER_WITHIN_S:g} s; see 'ray status', then run again; nothing was sent"
    )


def _cannot_read(node: dict[str, Any], marker: Path) -> str:
    name = node.get("NodeName") or node.get("NodeManagerAddress") or "?"
    return (
        f"Ray node {name} ({str(node.get('NodeID'))[:12]}) cannot read "
        f"{os.path.abspath(marker)}, which this driver wrote in loading_params.state_dir: the "
        "state folder must be a filesystem every node sees (a shared mount at the same path): "
        "mount it there or set state_dir to one; nothing was sent"
    )
