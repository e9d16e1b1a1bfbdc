"""``execution_params.ray``: the Ray cluster a ``mode: ray`` run uses and what each shard's task
asks of it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from mmirage.config.errors import FieldError
from mmirage.config.fields import NonNegativeFloat, PositiveInt

# A memory size as SLURM's --mem writes it: a number and an optional unit (K, M, G, T).
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass
class RayParams:
    """Ray mode: the cluster to run on and the resources each shard's task asks for."""

    address: str | None = None
    """The cluster (`ray://host:10001`, `host:6379` or `auto`). Unset: the `RAY_ADDRESS`
    variable, else a Ray instance started here for this run."""
    num_cpus: NonNegativeFloat = 1
    """CPUs each shard's task reserves (Ray's `num_cpus`)."""
    num_gpus: NonNegativeFloat = 0
    """GPUs each shard's task reserves (Ray's `num_gpus`); Ray gives the task those GPUs
    (`CUDA_VISIBLE_DEVICES`), and an engine a processor launches (`server_args`) runs on them,
    its `tp_size` defaulting to their number."""
    memory: str | None = None
    """Memory each shard's task reserves, e.g. `8G` (Ray's `memory`). Unset: none reserved."""
    runtime_env: dict[str, Any] = field(default_factory=dict)
    """Ray's `runtime_env` for the tasks (`env_vars`, `pip`, `working_dir`, …), passed to Ray
    as written. Keys go in `env_vars` as names of the driver's variables, never as values."""
    max_concurrent_shards: PositiveInt | None = None
    """At most this many shards run at once. Unset: as many as the cluster has room for."""

    def __post_init__(self) -> None:
        self.address = self.address or None
        if self.memory is not None:
            memory_bytes(self.memory)  # refused at load, not when the task is sent

    def resolved_address(self) -> str | None:
        """``address``, else ``RAY_ADDRESS``; ``None``: start a local instance."""
        return self.address or os.environ.get("RAY_ADDRESS") or None

    def task_options(self) -> dict[str, Any]:
        """Ray's options for one shard's task."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.memory is not None:
            options["memory"] = memory_bytes(self.memory)
        return options


def memory_bytes(text: str) -> int:
    """``8G`` → bytes; a ``FieldError`` naming ``memory`` for anything else."""
    found = _MEMORY.match(text)
    if not found:
        raise FieldError(
            "memory", f"must be a size such as 512M or 8G, got {text!r}; write a number and a unit"
        )
    number, unit = found.groups()
    return int(float(number) * _UNITS[unit.upper()])
