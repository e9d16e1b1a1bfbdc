"""When a dataset's rows are checkpointed (``core.shard.landing``): the first group at once,
then every ``CHECKPOINT_SECONDS``, before publishing, and on the way out of a failed run; and
a shard whose rows are all published is recorded so before its processors close."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from mmirage.core.shard import landing, run_shard, runner
from mmirage.core.shard.output import ShardOutput
from mmirage.core.shard.state import read_status
from mmirage.rundir import RunDir
from test_shard_runner import ONE_OUTPUT, FakeProcessor, make_config, procs, published


def count_checkpoints(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows_done of each checkpoint written, in order."""
    written: list[int] = []
    real = ShardOutput.checkpoint

    def spy(self: ShardOutput, ckpt: Any) -> None:
        real(self, ckpt)
        written.append(ckpt.rows_done)

    monkeypatch.setattr(ShardOutput, "checkpoint", spy)
    return written


@pytest.mark.parametrize(
    ("interval", "expected"),
    [
        # 10 rows in 5 groups: the first group; all of them before publishing (twice: the
        # last landing's own, then publish's, which finds nothing new). A group with a failed
        # row (row 4 has no text) waits like any other: what it paid for is in the store.
        (3600.0, [2, 10, 10]),
        (0.0, [2, 4, 6, 8, 10, 10]),  # no interval: every group
    ],
)
def test_the_first_group_is_checkpointed_at_once_then_one_per_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, interval: float, expected: list[int]
) -> None:
    monkeypatch.setattr(landing, "CHECKPOINT_SECONDS", interval)
    written = count_checkpoints(monkeypatch)
    config = make_config(tmp_path, batch_size=2, **ONE_OUTPUT)
    run_shard(config, 0, processors=procs(FakeProcessor()))
    assert written == expected
    assert len(published(config)) == 10


def test_a_failed_run_checkpoints_what_landed_and_its_status_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landing, "CHECKPOINT_SECONDS", 3600.0)
    written = count_checkpoints(monkeypatch)
    config = make_config(tmp_path, batch_size=2, **ONE_OUTPUT)
    with pytest.raises(RuntimeError, match="provider went away"):
        run_shard(config, 0, processors=procs(FakeProcessor(raise_on_call=4)))
    assert written == [2, 6]  # the first group, then the two that landed after it
    status = read_status(RunDir.of(config).status_path(0))
    assert status is not None and (status["status"], status["rows_done"]) == ("failed", 6)

    again = FakeProcessor()
    run_shard(config, 0, processors=procs(again))
    assert again.keys() == [f"0::{i}" for i in range(6, 10)]  # resumed after the 6


def test_a_signal_while_processors_close_leaves_a_published_shard_a_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM raises SystemExit wherever the loop is; a launched server takes seconds to
    stop, so it may well come while the processors close."""
    fake = FakeProcessor()

    @contextlib.asynccontextmanager
    async def closing_on_a_signal(*_: Any) -> AsyncIterator[dict[str, Any]]:
        yield procs(fake)
        raise SystemExit(143)

    monkeypatch.setattr(runner, "_processors", closing_on_a_signal)
    config = make_config(tmp_path, **ONE_OUTPUT)
    with pytest.raises(SystemExit):
        run_shard(config, 0)
    status = read_status(RunDir.of(config).status_path(0))
    assert status is not None and (status["status"], status["rows_done"]) == ("success", 10)
