"""A SIGTERM to a running shard cancels its coroutine at the next ``await``: the synchronous
step it arrived in (a journal rewrite, a checkpoint, a library callback) runs to its end, the
shard records why it stopped, and the process exits 143 as before."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from llm_kit import loops
from mmirage.core.shard.stop import cancelled_on_stop, exit_if_stopped, interruption
from mmirage.executors.signals import sigterm_as_exit


@pytest.fixture()
def sigterm_handler() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    sigterm_as_exit(120)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(main: Any) -> Any:
    """What ``run_shard`` does around its loop."""
    try:
        return loops.run(main)
    except asyncio.CancelledError:
        exit_if_stopped()
        raise


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
        _run(shard())
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
        _run(shard())
    assert cleaned == ["recorded"]


def test_outside_a_shard_a_sigterm_exits_at_once(sigterm_handler: None) -> None:
    with pytest.raises(SystemExit) as stopped:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000_000):  # the handler runs long before this ends
            pass
    assert stopped.value.code == 128 + signal.SIGTERM
