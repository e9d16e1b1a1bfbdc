"""A SIGTERM to a running shard cancels its coroutine at the next ``await``: the synchronous
step it arrived in (a journal rewrite, a checkpoint, a library callback) runs to its end, the
shard records why it stopped, and the process exits 143 as before."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from mmirage.core.shard.stop import cancelled_on_stop, interruption, run_stoppable
from mmirage.executors.signals import sigterm_as_exit


@pytest.fixture()
def sigterm_handler() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    sigterm_as_exit(120)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_sigterm_lets_the_step_finish_then_cancels_at_the_next_await(
    sigterm_handler: None,
) -> None:
    steps: list[object] = []

    async def shard() -> None:
        with cancelled_on_stop():
            try:
                os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode
                for i in range(10_000):  # a synchronous step: it must not be cut
                    steps.append(i)
                await asyncio.sleep(30)
                steps.append("not cancelled")
            except asyncio.CancelledError:
                steps.append("cancelled")
                raise

    with pytest.raises(SystemExit) as stopped:
        run_stoppable(shard())
    assert stopped.value.code == 128 + signal.SIGTERM
    assert steps == [*range(10_000), "cancelled"]
    assert interruption() == "interrupted"  # no SLURM deadline here


def test_a_second_sigterm_does_not_cut_the_cleanup(sigterm_handler: None) -> None:
    cleaned: list[str] = []

    async def shard() -> None:
        with cancelled_on_stop():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                os.kill(os.getpid(), signal.SIGTERM)  # e.g. SLURM's own, at the time limit
                await asyncio.sleep(0.05)  # cleanup that awaits (closing a client)
                cleaned.append("recorded")
                raise

    with pytest.raises(SystemExit):
        run_stoppable(shard())
    assert cleaned == ["recorded"]


def test_outside_a_shard_a_sigterm_exits_at_once(sigterm_handler: None) -> None:
    with pytest.raises(SystemExit) as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000_000):  # the handler runs long before this ends
            pass
    assert stopped.value.code == 128 + signal.SIGTERM


def test_a_sigterm_as_the_shard_ends_still_exits(sigterm_handler: None) -> None:
    """The shard finished (and recorded so) after the signal: no next shard starts."""

    async def shard() -> str:
        with cancelled_on_stop():
            os.kill(os.getpid(), signal.SIGTERM)
            return "published"  # no await left to cancel

    with pytest.raises(SystemExit) as stopped:
        run_stoppable(shard())
    assert stopped.value.code == 128 + signal.SIGTERM
