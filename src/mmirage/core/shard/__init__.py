"""Running shards: ``run_shard`` (runner), status.json and heartbeats (state), part files,
checkpoints and the atomic publish (output)."""

from __future__ import annotations

from mmirage.core.shard.runner import ShardReport, arun_shard, processor_key, run_shard
from mmirage.core.shard.state import ShardConflictError, shard_state

__all__ = [
    "ShardConflictError",
    "ShardReport",
    "arun_shard",
    "processor_key",
    "run_shard",
    "shard_state",
]
