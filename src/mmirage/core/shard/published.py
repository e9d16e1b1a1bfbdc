"""Before a shard counts as done: its published files must still be what was published."""

from __future__ import annotations

from mmirage.core.loader import DatasetShard
from mmirage.core.shard.output import Checkpoint, ShardOutput
from mmirage.core.shard.recovery import locator
from mmirage.core.shard.state import ShardConflictError


class ShardDamagedError(ShardConflictError):
    """A published shard file lost rows or changed since it was published; ``str(err)``
    names the file and what to do."""


def verified_finished(
    outputs: list[ShardOutput], shards: list[DatasetShard], fp: str, *, repair: bool
) -> list[Checkpoint | None]:
    """``out.finished()`` per dataset, after checking each published shard. A damaged one is
    salvaged (its readable rows kept, the rest to be computed again) when ``repair``, else
    ``ShardDamagedError``."""
    done: list[Checkpoint | None] = []
    for out, shard in zip(outputs, shards, strict=True):
        problem = out.damage()
        if problem is not None:
            if not repair:
                raise ShardDamagedError(
                    f"{problem}; run 'mmirage run CONFIG --shard-id {shard.shard_id} "
                    "--force-retry' to keep its readable rows and compute the missing ones "
                    "again"
                )
            out.salvage(fp, locator(shard))
        done.append(out.finished())
    return done
