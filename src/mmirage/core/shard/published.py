"""Before a shard counts as done: its published files must still be what was published."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmirage.core.loader import DatasetShard
from mmirage.core.shard.output import ShardCheckpoint, ShardOutput
from mmirage.core.shard.recovery import locator
from mmirage.core.shard.remote_output import shard_output
from mmirage.core.shard.state import ShardConflictError

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

DAMAGED = "damaged"  # a shard state for `check`: success recorded, but a published file is not
# A shard state for `check`: succeeded, under another configuration (or being computed again).
OUTDATED = "outdated"


class ShardDamagedError(ShardConflictError):
    """A published shard file lost rows or changed since it was published; ``str(err)``
    names the file and what to do."""


def repair_hint(shard_id: int) -> str:
    return (
        f"run 'mmirage run CONFIG --shard-id {shard_id} --force-retry' to keep its readable "
        "rows and compute the missing ones again"
    )


def shard_damage(config: MMirageConfig, shard_id: int, *, full: bool = False) -> str | None:
    """The first damaged published file of shard ``shard_id`` (one sentence with what to
    do), or ``None``. ``full`` also compares checksums (a whole read of each file)."""
    lp = config.loading_params
    for ds in lp.datasets:
        out = shard_output(lp, ds, shard_id)
        problem = out.damage(full=full)
        if problem is not None:
            return f"{problem}; {repair_hint(shard_id)}"
    return None


def is_current(out: ShardOutput, fingerprint: str) -> bool:
    """Whether ``out`` is published, by a run of the configuration whose fingerprint is
    ``fingerprint`` (a shard published before fingerprints were recorded counts), and is not
    being computed again (its published version is then an older one)."""
    done = out.finished()
    return done is not None and done.fingerprint in ("", fingerprint)


def outdated_hint(config_path: object) -> str:
    return (
        f"was computed under another configuration (or is being computed again): 'mmirage run "
        f"{config_path}' computes it again, paying only for the requests that changed"
    )


def verified_finished(
    outputs: list[ShardOutput], shards: list[DatasetShard], fp: str, *, repair: bool
) -> list[ShardCheckpoint | None]:
    """``out.finished()`` per dataset, after checking each published shard. A damaged one is
    salvaged (its readable rows kept, the rest to be computed again) when ``repair``, else
    ``ShardDamagedError``. ``repair`` (``--force-retry``, which a merge's damage sentence
    advises) compares checksums too: an edit that kept size and rows is found only so."""
    done: list[ShardCheckpoint | None] = []
    for out, shard in zip(outputs, shards, strict=True):
        problem = out.damage(full=repair)
        if problem is not None:
            if not repair:
                raise ShardDamagedError(f"{problem}; {repair_hint(shard.shard_id)}")
            out.salvage(fp, locator(shard))
        done.append(out.finished())
    return done
