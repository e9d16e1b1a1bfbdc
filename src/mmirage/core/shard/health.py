"""A shard's state as ``mmirage check`` and ``mmirage retry`` see it.

Its status.json state (``shard_state``), then what status.json alone does not say: a
succeeded shard whose published file lost rows or changed is ``damaged``; one published under
another configuration (the config was edited since) is ``outdated``; one whose
published rows include rows that failed for a retryable reason (a rate limit, a server
error, a timeout) is ``partial``: ``mmirage retry`` computes just those rows again. Rows that
failed for good (an answer that missed its schema or was cut at the token limit, a refusal,
a bad row) leave the shard ``success``: a retry would pay for the same answer again, so they
are reported, never counted against the shard.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmirage.core.shard.published import DAMAGED, OUTDATED, is_current, outdated_hint, shard_damage
from mmirage.core.shard.remote_output import shard_output
from mmirage.core.shard.state import SUCCESS, read_status, shard_state
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

PARTIAL = "partial"  # succeeded, but some rows failed for a retryable reason


@dataclass
class ShardHealth:
    state: str
    status: dict[str, Any]  # status.json (``error`` set to the damage, when damaged)
    notes: list[str] = field(default_factory=list)  # one sentence each: what is wrong, what to do


def shard_health(
    config: MMirageConfig, run_dir: RunDir, shard_id: int, config_path: object
) -> ShardHealth:
    """The state of shard ``shard_id``; ``config_path`` is named in the notes' commands."""
    raw = read_status(run_dir.status_path(shard_id))
    health = ShardHealth(shard_state(raw, config.execution_params.max_retries), dict(raw or {}))
    if health.state != SUCCESS:
        return health
    damage = shard_damage(config, shard_id)
    if damage is not None:
        health.state, health.status["error"] = DAMAGED, damage
        health.notes.append(f"shard {shard_id}: {damage}")
        return health
    lp = config.loading_params
    outputs = [shard_output(lp, ds, shard_id) for ds in lp.datasets]
    if not all(is_current(out, run_dir.fingerprint) for out in outputs):
        health.state = OUTDATED
        health.notes.append(f"shard {shard_id} {outdated_hint(config_path)}")
        return health
    retryable = int(health.status.get("rows_retryable") or 0)
    for_good = int(health.status.get("rows_failed") or 0) - retryable
    if retryable:
        health.state = PARTIAL
        health.notes.append(
            f"shard {shard_id}: {retryable} row(s) failed for a retryable reason (rate limit, "
            f"server error, timeout); 'mmirage retry {config_path}' computes just those rows "
            "again, reusing the outputs they already got"
        )
    if for_good > 0:
        health.notes.append(
            f"shard {shard_id}: {for_good} row(s) failed for good (an answer that missed its "
            "schema or was cut at the token limit, a refusal, a bad row: see their __errors__); "
            "a retry would buy the same answer again: raise max_new_tokens, loosen the schema "
            "or fix the input, then run again"
        )
    return health
