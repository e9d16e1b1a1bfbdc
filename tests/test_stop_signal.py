"""A SIGTERM to a running shard cancels its coroutine at the next ``await``: the synchronous
step it arrived in (a journal rewrite, a checkpoint, a library callback) runs to its end, the
shard records why it stopped, and the process exits 143 as before. At a SLURM time limit the
shard is drained first: its requests in flight come back before the cancel."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import pytest

from mmirage.core.shard.stop import (
    DEADLINE_ENV,
    DRAIN_MAX_S,
    cancelled_on_stop,
    drain_seconds,
    drained_first,
    interruption,
    run_stoppable,
)
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


def near_deadline(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    monkeypatch.setenv(DEADLINE_ENV, str(time.time() + seconds))


def test_how_long_a_stop_may_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEADLINE_ENV, raising=False)
    assert drain_seconds(120) == 0  # not a SLURM task: a stop is at once
    near_deadline(monkeypatch, 1000)
    assert drain_seconds(120) == 0  # far from the time limit: interrupted, not drained
    near_deadline(monkeypatch, 150)
    assert drain_seconds(120) == DRAIN_MAX_S  # under a scancel's KillWait, whatever is left
    near_deadline(monkeypatch, 40)
    assert 19 < drain_seconds(120) <= 20  # until 20 s before the deadline
    near_deadline(monkeypatch, 30)
    assert 14 < drain_seconds(120) <= 15  # half of what is left, when that is less


def drained_shard(
    steps: list[str], drain_s: float, second_signal: bool = False, signals: int = 1
) -> Coroutine[Any, Any, None]:
    async def drain() -> None:
        steps.append("draining")
        if second_signal:
            os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(drain_s)  # the requests in flight coming back
        steps.append("drained")

    async def shard() -> None:
        with cancelled_on_stop(), drained_first(drain):
            try:
                for _ in range(signals):  # handled before the loop runs the first
                    os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                steps.append("cancelled")
                raise

    return shard()


def test_at_the_time_limit_the_shard_is_drained_then_cancelled(
    sigterm_handler: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    near_deadline(monkeypatch, 60)
    steps: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run_stoppable(drained_shard(steps, 0.2))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert steps == ["draining", "drained", "cancelled"]
    assert interruption().startswith("time limit")


def test_a_drain_that_outlasts_its_time_is_abandoned(
    sigterm_handler: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    near_deadline(monkeypatch, 3.0)  # 1.5 s to drain
    steps: list[str] = []
    with caplog.at_level(logging.WARNING), pytest.raises(SystemExit):
        run_stoppable(drained_shard(steps, 30))
    assert steps == ["draining", "cancelled"]
    assert "requests still in flight after" in caplog.text


def test_a_second_signal_cuts_the_drain_short(
    sigterm_handler: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    near_deadline(monkeypatch, 60)
    steps: list[str] = []
    with pytest.raises(SystemExit):
        run_stoppable(drained_shard(steps, 30, second_signal=True))
    assert steps == ["draining", "cancelled"]  # not the 30 s


def test_an_interruption_is_not_drained(
    sigterm_handler: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DEADLINE_ENV, raising=False)  # Ctrl-C, kill, scancel: out at once
    steps: list[str] = []
    with pytest.raises(SystemExit):
        run_stoppable(drained_shard(steps, 0.2))
    assert steps == ["cancelled"]


def test_two_signals_in_one_turn_of_the_loop_still_cancel_the_shard(
    sigterm_handler: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second cancels the drain before it starts: the shard is cancelled all the same."""
    near_deadline(monkeypatch, 60)
    steps: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run_stoppable(drained_shard(steps, 30, signals=2))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert steps == ["cancelled"]
