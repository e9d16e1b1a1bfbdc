"""How a shard stops on a signal (Ctrl-C, SIGTERM, ``scancel``, the SLURM time limit), and why
it records that it stopped.

While a shard's coroutine runs, a stop signal cancels it at its next ``await`` instead of
raising where the interpreter happens to be: a journal rewrite, a checkpoint or a library's
callback (aiohttp turns any exception in its parser into a payload error, which would be
retried) is never cut in half, and the shard records why it stopped.

Every stop is graceful: the requests in flight are paid for, so the shard first drains its
processors (no new row is started; the requests under way, with their retries, come back and
are stored) for up to ``execution_params.stop_grace_seconds``, then is cancelled, and the
process exits 128 + the signal's number (130 for SIGINT, 143 for SIGTERM) after one sentence
on stderr. In a SLURM task the drain may be shorter: SLURM follows its SIGTERM (``scancel``,
the time limit) with SIGKILL after KillWait, and the task must have recorded its state by then
(``drain_seconds``). A second signal cuts the drain short."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

logger = logging.getLogger(__name__)

# Set by the SLURM job script: when SLURM will end the task (epoch seconds).
DEADLINE_ENV = "MMIRAGE_SLURM_DEADLINE"
# SLURM sends the --signal "up to 60 seconds earlier than specified" (sbatch(1)), never later
# than the deadline itself.
_SLACK_S = 60.0
# Of the time left at the time limit, what the way out keeps (at most half of it): the last
# checkpoint and the status, before SLURM's SIGKILL.
_EXIT_RESERVE_S = 20.0
# Set by the SLURM job script: the cluster's KillWait (seconds). A scancel, a preemption or
# the time limit itself sends SIGTERM, then SIGKILL after KillWait: the shard must have recorded
# its state by then, whatever stop_grace_seconds says.
KILL_WAIT_ENV = "MMIRAGE_SLURM_KILL_WAIT"
_KILL_WAIT_S = 30.0  # SLURM's default, when the job script could not read it
# Of KillWait, what the way out keeps (a quarter of it, when that is less): the checkpoint and
# the status. So the longest drain in a SLURM task at the default KillWait is 25 s.
_KILL_RESERVE_S = 5.0
DRAIN_MAX_S = _KILL_WAIT_S - _KILL_RESERVE_S
_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<rest>\d+(?::\d{1,2}){0,2})$")


def slurm_seconds(text: str) -> int:
    """A SLURM --time (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S) in seconds."""
    match = _TIME.match(text.strip())
    if not match:
        raise ValueError(f"not a SLURM time: {text!r}")
    parts = [int(p) for p in match["rest"].split(":")]
    if match["d"] is not None:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = [*parts, 0, 0][:3]
        return ((int(match["d"]) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:  # M
        return parts[0] * 60
    if len(parts) == 2:  # M:S
        return parts[0] * 60 + parts[1]
    hours, minutes, seconds = parts
    return (hours * 60 + minutes) * 60 + seconds


# Signals are process-wide: the handler notes why here, and the shard, which sees only a
# CancelledError or a SystemExit, records it.
_noted: list[str] = []


def note(reason: str) -> None:
    _noted.append(reason)


# How a stop's drain went (``_Stop.how``), for the sentence on stderr.
KEPT = "kept"  # every request in flight came back and was stored
ABANDONED = "abandoned"  # some were still in flight when the drain's time was up
FAILED = "failed"  # the drain itself failed (its pool died): what came back is stored
AT_ONCE = "at once"  # no time to drain (stop_grace_seconds 0, or the SLURM deadline)
HURRIED = "hurried"  # a second signal cut the drain short
IDLE = "idle"  # no processor was running: nothing was in flight


@dataclass
class _Stop:
    """A stop asked for by a signal: why, the exit status it asks for, what sent it, how long
    it may drain, and how that went (``None`` until the loop got to it)."""

    reason: str
    exit_status: int
    cause: str
    drain_s: float
    how: str | None = None
    kept: int | None = None  # answers that came back during the drain, when the drain tells


class _Shard:
    """A running shard's coroutine, what drains it before a stop, and that drain under way."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop, self.task = loop, task
        self.drain: Callable[[], Awaitable[object]] | None = None
        self._draining: asyncio.Task[None] | None = None

    def stop(self, stop: _Stop) -> None:
        """In the loop: cancel the shard, after draining it for up to ``stop.drain_s``."""
        if stop.drain_s > 0 and self.drain is not None:
            say(
                f"{stop.cause}: stopping; waiting up to {stop.drain_s:g} s for the requests in "
                "flight (a second signal stops at once)"
            )
            self._draining = self.loop.create_task(_drained(self.drain, stop))
            # However the drain ends, even cancelled before its first step (a second signal
            # in the same turn of the loop), the shard is cancelled then.
            self._draining.add_done_callback(lambda _: self.task.cancel())
        else:
            stop.how = IDLE if self.drain is None else AT_ONCE
            self.task.cancel()

    def hurry(self, stop: _Stop) -> None:
        """In the loop: a drain under way ends now (and so cancels the shard)."""
        if self._draining is not None and not self._draining.done():
            stop.how = HURRIED
            self._draining.cancel()


async def _drained(drain: Callable[[], Awaitable[object]], stop: _Stop) -> None:
    draining = asyncio.ensure_future(drain())
    # Cut short, the drain may still end in an error later (its parts cancelled one by one as
    # the loop closes): taken here, it is not logged as "never retrieved".
    draining.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        kept = await asyncio.wait_for(draining, stop.drain_s)
    except TimeoutError:
        stop.how = ABANDONED  # said in the last sentence, as every other end of a drain
        logger.info("requests still in flight after %g s are abandoned", stop.drain_s)
    except Exception:  # the stop goes on: what the drain kept is stored already
        stop.how = FAILED
        logger.debug("the drain before the stop failed", exc_info=True)
    else:
        stop.how, stop.kept = KEPT, _answers(kept)


def _answers(drained: object) -> int | None:
    """How many answers a drain kept: the number it returned, or the sum of those its
    processors returned (``None``: none of them can tell)."""
    parts = drained if isinstance(drained, list | tuple) else [drained]
    counts = [n for n in parts if isinstance(n, int) and not isinstance(n, bool)]
    return sum(counts) if counts else None


# The shard coroutine a stop signal cancels; and the stop under way.
_shard: list[_Shard] = []
_stops: list[_Stop] = []


@contextlib.contextmanager
def cancelled_on_stop() -> Iterator[None]:
    """Inside a shard's coroutine: a stop signal meanwhile cancels it (``stop_shard``)."""
    task = asyncio.current_task()
    assert task is not None, "called outside a coroutine"
    _stops.clear()
    _shard.append(_Shard(asyncio.get_running_loop(), task))
    try:
        yield
    finally:
        _shard.pop()


@contextlib.contextmanager
def drained_first(drain: Callable[[], Awaitable[object]]) -> Iterator[None]:
    """Inside ``cancelled_on_stop``: a stop with time to drain (``drain_seconds``) awaits
    ``drain()`` before it cancels the shard. ``drain()`` may return how many answers came back
    (or a list of such numbers, one per processor) for the sentence on stderr."""
    if not _shard:
        yield
        return
    shard = _shard[-1]
    shard.drain = drain
    try:
        yield
    finally:
        shard.drain = None


def stop_shard(
    reason: str, exit_status: int, drain_s: float = 0.0, cause: str = "a signal"
) -> bool:
    """From a signal handler: when a shard's coroutine runs, note ``reason`` and cancel it at
    its next await, after draining it for up to ``drain_s`` seconds (the loop does that, not
    the handler); whether one was running. ``cause`` names the signal in the sentence."""
    if not _shard:
        return False
    note(reason)
    stop = _Stop(reason, exit_status, cause, drain_s)
    _stops.append(stop)
    shard = _shard[-1]
    shard.loop.call_soon_threadsafe(shard.stop, stop)
    return True


def hurry_stop() -> None:
    """From a signal handler, at a second stop signal: a drain under way ends now. A stop
    already past its drain is left alone: its cleanup records the shard's state."""
    if _shard and _stops:
        shard = _shard[-1]
        shard.loop.call_soon_threadsafe(shard.hurry, _stops[0])


def exit_at_once(reason: str, exit_status: int, cause: str) -> NoReturn:
    """From a signal handler, when no shard's coroutine runs (starting, between shards,
    closing): note ``reason``, say so on stderr and exit with ``exit_status``."""
    note(reason)
    say(stop_sentence(_Stop(reason, exit_status, cause, 0.0)))
    raise SystemExit(exit_status)


def run_stoppable(main: Coroutine[Any, Any, T]) -> T:
    """``loops.run(main)``, ``main`` being a shard's coroutine (``cancelled_on_stop``): once a
    stop signal cancelled it, or came as it ended, say so and exit as the signal asked."""
    # Here, not at the top: the SLURM script writer reads this module's deadline helpers and
    # must not import llm_kit (aiohttp) for them.
    from llm_kit import loops

    try:
        result = loops.run(main)
    except (asyncio.CancelledError, KeyboardInterrupt):
        # A KeyboardInterrupt during a stop is part of it (a worker process of the shard's
        # got the terminal's Ctrl-C too, and its call ended in one).
        _exit_if_stopped()
        raise
    _exit_if_stopped()  # no next shard starts
    return result


def _exit_if_stopped() -> None:
    if _stops:
        say(stop_sentence(_stops[0]))
        raise SystemExit(_stops[0].exit_status)


def say(sentence: str) -> None:
    """One line on stderr, written at once: safe in a signal handler (no buffer of Python's
    that the interrupted code may be in the middle of), and quiet when stderr is gone."""
    with contextlib.suppress(OSError):
        os.write(2, f"{sentence}\n".encode())


def stop_sentence(stop: _Stop) -> str:
    """What a stopped process says last: what stopped it, what came of the requests in
    flight, and how to go on."""
    time_limit = stop.reason.startswith("time limit")
    what = "stopped at the SLURM time limit" if time_limit else f"interrupted by {stop.cause}"
    again = "the rerun sends them again"
    n = stop.kept
    if (stop.how == KEPT and n == 0) or stop.how == IDLE:
        fate = "no request was in flight"
    elif stop.how == KEPT and n == 1:
        fate = "the answer in flight came back and is kept"
    elif stop.how == KEPT and n is not None:
        fate = f"the {n} answers in flight came back and are kept"
    elif stop.how == KEPT:
        fate = "every request in flight came back and is kept"
    elif stop.how == ABANDONED:
        fate = f"the requests still in flight after {stop.drain_s:g} s were abandoned ({again})"
    elif stop.how == FAILED:
        fate = f"waiting for the requests in flight failed; those not back are lost ({again})"
    elif stop.how in (AT_ONCE, HURRIED):
        by = "a second signal stopped it" if stop.how == HURRIED else "it stopped"
        fate = f"{by} at once, without waiting for the requests in flight ({again})"
    else:  # the shard ended before the stop reached it, or none was running
        fate = "what finished is kept"
    resume = "'mmirage retry' resumes it" if time_limit else "run the same command again to go on"
    return f"{what}: {fate}; {resume}"


def interruption() -> str:
    """What an interrupted shard records: the signal's reason, else plain "interrupted"."""
    return _noted[-1] if _noted else "interrupted"


def _time_left() -> float | None:
    """Seconds until SLURM ends this task, when it is a SLURM task."""
    deadline = os.environ.get(DEADLINE_ENV)
    try:
        return float(deadline) - time.time() if deadline else None
    except ValueError:
        return None


def _at_time_limit(left: float | None, grace_s: float) -> bool:
    return left is not None and left <= grace_s + _SLACK_S


def drain_seconds(stop_grace_s: float) -> float:
    """How long a stop may let the requests in flight come back: ``stop_grace_s``; in a SLURM
    task also until 5 s before KillWait is over (``DRAIN_MAX_S`` at SLURM's default: SIGKILL
    follows its SIGTERM after KillWait) and until ``_EXIT_RESERVE_S`` before the deadline (half
    the time left, when that is less)."""
    left = _time_left()
    if left is None:
        return max(0.0, stop_grace_s)
    kill_wait = _kill_wait()
    before_kill = kill_wait - min(_KILL_RESERVE_S, kill_wait / 4)
    before_end = left - min(_EXIT_RESERVE_S, left / 2)
    return max(0.0, min(stop_grace_s, before_kill, before_end))


def _kill_wait() -> float:
    try:
        return float(os.environ.get(KILL_WAIT_ENV) or _KILL_WAIT_S)
    except ValueError:
        return _KILL_WAIT_S


def stop_reason(signum: int, grace_s: float) -> str:
    """``time limit`` when SLURM's deadline is this close (``grace_s``: the job script's
    ``--signal`` lead, ``signal_grace_seconds``), else ``interrupted``."""
    if _at_time_limit(_time_left(), grace_s):
        return (
            "time limit: SLURM ends this task at execution_params.time_limit; it stopped at "
            "its checkpoint and 'mmirage retry' resumes it"
        )
    return "interrupted"


def signal_name(signum: int) -> str:
    """``SIGINT``, ``SIGTERM``... (the number, for a signal Python has no name for)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
