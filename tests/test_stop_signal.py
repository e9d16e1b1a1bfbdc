"""A SIGINT or SIGTERM to a running shard cancels its coroutine at the next ``await``: the
synchronous step it arrived in (a journal rewrite, a checkpoint, a library callback) runs to its
end, the shard records why it stopped, and the process exits 130 or 143 with one sentence on
stderr. Every stop drains the shard first (its requests in flight come back before the cancel)
for up to ``stop_grace_seconds``, less in a SLURM task; a second signal cuts the drain short.

In-process: the handlers are installed for the test and the signals sent to this process."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from mmirage.core.shard import stop as stop_module
from mmirage.core.shard.stop import (
    DEADLINE_ENV,
    DRAIN_MAX_S,
    KILL_WAIT_ENV,
    cancelled_on_stop,
    drain_seconds,
    drained_first,
    interruption,
    run_stoppable,
    stop_sentence,
)
from mmirage.executors.signals import (
    PARENT_HURRY,
    PARENT_PID_ENV,
    PARENT_STOP,
    STOP_SIGNALS,
    stop_on_signals,
)

HANDLED = (*STOP_SIGNALS, PARENT_STOP, PARENT_HURRY)
Install = Callable[..., None]


@pytest.fixture()
def handlers(monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """``install(stop_grace_s=20, signal_grace_s=120)``: this process's stop handlers, as a
    shard process has them; the previous ones are back after the test."""
    monkeypatch.delenv(DEADLINE_ENV, raising=False)
    previous = {signum: signal.getsignal(signum) for signum in HANDLED}
    if previous[signal.SIGINT] is signal.SIG_IGN:  # a test run started as `pytest &`
        signal.signal(signal.SIGINT, signal.default_int_handler)  # kept ignored, else

    def install(stop_grace_s: float = 20.0, signal_grace_s: float = 120.0) -> None:
        stop_on_signals(stop_grace_s, signal_grace_s)

    try:
        yield install
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_a_sigterm_lets_the_step_finish_then_cancels_at_the_next_await(
    handlers: Install,
) -> None:
    handlers()
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


def test_a_second_sigterm_does_not_cut_the_cleanup(handlers: Install) -> None:
    handlers()
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


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_outside_a_shard_a_signal_exits_at_once_and_says_so(
    handlers: Install, signum: int, capfd: pytest.CaptureFixture[str]
) -> None:
    handlers()
    with pytest.raises(SystemExit) as stopped:
        os.kill(os.getpid(), signum)
        for _ in range(10_000_000):  # the handler runs long before this ends
            pass
    assert stopped.value.code == 128 + signum
    said = capfd.readouterr().err.splitlines()
    assert said == [
        f"interrupted by {signal.Signals(signum).name}: what finished is kept; run the same "
        "command again to go on"
    ]


def test_a_sigterm_as_the_shard_ends_still_exits(handlers: Install) -> None:
    """The shard finished (and recorded so) after the signal: no next shard starts."""
    handlers()

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
    monkeypatch.delenv(KILL_WAIT_ENV, raising=False)
    assert drain_seconds(20) == 20  # not a SLURM task: stop_grace_seconds
    assert drain_seconds(90) == 90  # nothing to stop it here but the user
    assert drain_seconds(0) == 0  # stop at once
    near_deadline(monkeypatch, 1000)  # a SLURM task, far from its end: scancel
    assert drain_seconds(20) == 20
    assert drain_seconds(90) == DRAIN_MAX_S  # SIGKILL follows after KillWait (30 s)
    near_deadline(monkeypatch, 40)
    assert 19 < drain_seconds(90) <= 20  # until 20 s before the deadline
    assert drain_seconds(10) == 10
    near_deadline(monkeypatch, 30)
    assert 14 < drain_seconds(90) <= 15  # half of what is left, when that is less
    near_deadline(monkeypatch, -5)
    assert drain_seconds(20) == 0  # past the deadline: no time at all
    near_deadline(monkeypatch, 1000)
    monkeypatch.setenv(KILL_WAIT_ENV, "60")  # the cluster's KillWait, from the job script
    assert drain_seconds(90) == 55
    monkeypatch.setenv(KILL_WAIT_ENV, "4")
    assert drain_seconds(20) == 3  # a quarter of a short KillWait is kept for the way out


def drained_shard(
    steps: list[str],
    drain_s: float,
    *,
    signum: int = signal.SIGTERM,
    then: int | None = None,
    signals: int = 1,
    kept: object = None,
) -> Coroutine[Any, Any, None]:
    async def drain() -> object:
        steps.append("draining")
        if then is not None:  # a signal while it drains
            os.kill(os.getpid(), then)
        await asyncio.sleep(drain_s)  # the requests in flight coming back
        steps.append("drained")
        return kept

    async def shard() -> None:
        with cancelled_on_stop(), drained_first(drain):
            try:
                for _ in range(signals):  # handled before the loop runs the first
                    os.kill(os.getpid(), signum)
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                steps.append("cancelled")
                raise

    return shard()


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_stop_drains_the_shard_then_cancels_it(
    handlers: Install, signum: int, capfd: pytest.CaptureFixture[str]
) -> None:
    handlers()
    steps: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run_stoppable(drained_shard(steps, 0.2, signum=signum, kept=[3, None]))
    assert stopped.value.code == 128 + signum
    assert steps == ["draining", "drained", "cancelled"]
    assert interruption() == "interrupted"
    name = signal.Signals(signum).name
    assert capfd.readouterr().err.splitlines() == [
        f"{name}: stopping; waiting up to 20 s for the requests in flight (a second signal "
        "stops at once)",
        f"interrupted by {name}: the 3 answers in flight came back and are kept; run the same "
        "command again to go on",
    ]


def test_at_the_time_limit_the_shard_is_drained_then_cancelled(
    handlers: Install, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    handlers()
    near_deadline(monkeypatch, 60)
    steps: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run_stoppable(drained_shard(steps, 0.2, kept=0))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert steps == ["draining", "drained", "cancelled"]
    assert interruption().startswith("time limit")
    assert capfd.readouterr().err.splitlines()[-1] == (
        "stopped at the SLURM time limit: no request was in flight; 'mmirage retry' resumes it"
    )


def test_a_drain_that_outlasts_its_time_is_abandoned(
    handlers: Install, capfd: pytest.CaptureFixture[str]
) -> None:
    handlers(stop_grace_s=1.5)
    steps: list[str] = []
    with pytest.raises(SystemExit):
        run_stoppable(drained_shard(steps, 30))
    assert steps == ["draining", "cancelled"]
    last = capfd.readouterr().err.splitlines()[-1]
    assert "the requests still in flight after 1.5 s were abandoned (the rerun sends" in last


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_second_signal_cuts_the_drain_short(
    handlers: Install, signum: int, capfd: pytest.CaptureFixture[str]
) -> None:
    handlers(stop_grace_s=120)
    steps: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run_stoppable(drained_shard(steps, 30, signum=signum, then=signum))
    assert stopped.value.code == 128 + signum
    assert steps == ["draining", "cancelled"]  # not the 30 s
    assert "a second signal stopped it at once" in capfd.readouterr().err


def test_no_grace_stops_at_once(handlers: Install, capfd: pytest.CaptureFixture[str]) -> None:
    handlers(stop_grace_s=0)  # execution_params.stop_grace_seconds: 0
    steps: list[str] = []
    with pytest.raises(SystemExit):
        run_stoppable(drained_shard(steps, 0.2, signum=signal.SIGINT))
    assert steps == ["cancelled"]
    assert "it stopped at once, without waiting" in capfd.readouterr().err


def test_two_signals_in_one_turn_of_the_loop_still_cancel_the_shard(handlers: Install) -> None:
    """The second cancels the drain before it starts: the shard is cancelled all the same."""
    handlers()
    steps: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run_stoppable(drained_shard(steps, 30, signals=2))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert steps == ["cancelled"]


def test_a_parents_stop_and_the_signal_it_passes_on_are_one_stop(
    handlers: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C reaches a child both from the terminal and through its parent: still drained."""
    monkeypatch.setenv(PARENT_PID_ENV, str(os.getppid()))
    handlers()
    steps: list[str] = []
    with pytest.raises(SystemExit):
        run_stoppable(drained_shard(steps, 0.2, signum=PARENT_STOP, then=signal.SIGINT))
    assert steps == ["draining", "drained", "cancelled"]


def test_a_parents_hurry_cuts_the_drain_short(
    handlers: Install, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PARENT_PID_ENV, str(os.getppid()))
    handlers()
    steps: list[str] = []
    with pytest.raises(SystemExit) as stopped:
        run_stoppable(drained_shard(steps, 0.2, signum=PARENT_STOP, then=PARENT_HURRY))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert steps == ["draining", "cancelled"]


def test_a_signal_the_process_was_started_ignoring_stays_ignored(handlers: Install) -> None:
    """``cmd &`` in a script: the shell keeps the script's Ctrl-C from its background jobs."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    handlers()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL)


PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
HOWS = ("kept", "abandoned", "failed", "at once", "hurried", "idle", None)


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("reason", ["interrupted", "time limit: SLURM ends this task"])
def test_every_stop_sentence_is_on_the_troubleshooting_page(how: str | None, reason: str) -> None:
    page = re.sub(r"\s+", " ", PAGE.read_text())
    quotes = [q for q in re.findall(r"`([^`]+)`", page) if "<" in q or " " in q]
    patterns = [".+?".join(map(re.escape, re.split(r"<[a-z ]+>", q))) for q in quotes]
    for kept in (None, 0, 1, 7) if how == "kept" else (None,):
        stop = stop_module._Stop(reason, 130, "SIGINT", 20.0, how, kept)
        sentence = stop_sentence(stop)
        assert any(re.fullmatch(p, sentence) for p in patterns), sentence
        fate = sentence.split(": ", 1)[1].rsplit("; ", 1)[0]  # each variant is listed too
        assert any(re.fullmatch(p, fate) for p in patterns), fate
