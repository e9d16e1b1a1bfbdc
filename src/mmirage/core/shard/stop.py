"""Why a shard was stopped by a signal, recorded in its status: a SLURM task that reached its
time limit is told so ``--signal`` seconds before the end, and says "time limit".

While a shard's coroutine runs, a stop signal cancels it at its next ``await`` instead of
raising where the interpreter happens to be: a journal rewrite, a checkpoint or a library's
callback (aiohttp turns any exception in its parser into a payload error, which would be
retried) is never cut in half, and the shard records why it stopped.

At the time limit there is time left, and the requests in flight are paid for: the shard first
drains its processors (no new row is started; the requests under way, with their retries, come
back and are journaled) for up to ``DRAIN_MAX_S``, then is cancelled. A second signal cuts the
drain short."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, TypeVar

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
# The longest drain. A scancel or a preemption in the last minutes looks like the time limit,
# and SLURM's SIGKILL follows it after KillWait (30 s by default): the shard must have recorded
# its state by then.
DRAIN_MAX_S = 25.0
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


class _Shard:
    """A running shard's coroutine, what drains it before a stop, and that drain under way."""

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        self.loop, self.task = loop, task
        self.drain: Callable[[], Awaitable[object]] | None = None
        self._draining: asyncio.Task[None] | None = None

    def stop(self, drain_s: float) -> None:
        """In the loop: cancel the shard, after draining it for up to ``drain_s`` seconds."""
        if drain_s > 0 and self.drain is not None:
            self._draining = self.loop.create_task(_drained(self.drain, drain_s))
            # However the drain ends, even cancelled before its first step (a second signal
            # in the same turn of the loop), the shard is cancelled then.
            self._draining.add_done_callback(lambda _: self.task.cancel())
        else:
            self.task.cancel()

    def hurry(self) -> None:
        """In the loop: a drain under way ends now (and so cancels the shard)."""
        if self._draining is not None:
            self._draining.cancel()


async def _drained(drain: Callable[[], Awaitable[object]], seconds: float) -> None:
    try:
        await asyncio.wait_for(drain(), seconds)
    except TimeoutError:
        logger.warning("requests still in flight after %.0f s are abandoned", seconds)
    except Exception:  # the stop goes on: what the drain kept is journaled already
        logger.debug("the drain before the stop failed", exc_info=True)


# The shard coroutine a stop signal cancels; and the exit status it asked for.
_shard: list[_Shard] = []
_exit_status: list[int] = []


@contextlib.contextmanager
def cancelled_on_stop() -> Iterator[None]:
    """Inside a shard's coroutine: a stop signal meanwhile cancels it (``stop_shard``)."""
    task = asyncio.current_task()
    assert task is not None, "called outside a coroutine"
    _exit_status.clear()
    _shard.append(_Shard(asyncio.get_running_loop(), task))
    try:
        yield
    finally:
        _shard.pop()


@contextlib.contextmanager
def drained_first(drain: Callable[[], Awaitable[object]]) -> Iterator[None]:
    """Inside ``cancelled_on_stop``: a stop with time to drain (``drain_seconds``) awaits
    ``drain()`` before it cancels the shard."""
    if not _shard:
        yield
        return
    shard = _shard[-1]
    shard.drain = drain
    try:
        yield
    finally:
        shard.drain = None


def stop_shard(reason: str, exit_status: int, drain_s: float = 0.0) -> bool:
    """From a signal handler: when a shard's coroutine runs, note ``reason`` and cancel it at
    its next await, after draining it for up to ``drain_s`` seconds (the loop does that, not
    the handler); whether one was running."""
    if not _shard:
        return False
    note(reason)
    _exit_status.append(exit_status)
    shard = _shard[-1]
    shard.loop.call_soon_threadsafe(shard.stop, drain_s)
    return True


def hurry_stop() -> None:
    """From a signal handler, at a second stop signal: a drain under way ends now. A stop
    already past its drain is left alone: its cleanup records the shard's state."""
    if _shard:
        shard = _shard[-1]
        shard.loop.call_soon_threadsafe(shard.hurry)


def run_stoppable(main: Coroutine[Any, Any, T]) -> T:
    """``loops.run(main)``, ``main`` being a shard's coroutine (``cancelled_on_stop``): once a
    stop signal cancelled it, or came as it ended, exit as the signal asked."""
    # Here, not at the top: the SLURM script writer reads this module's deadline helpers and
    # must not import llm_kit (aiohttp) for them.
    from llm_kit import loops

    try:
        result = loops.run(main)
    except asyncio.CancelledError:
        _exit_if_stopped()
        raise
    _exit_if_stopped()  # no next shard starts
    return result


def _exit_if_stopped() -> None:
    if _exit_status:
        raise SystemExit(_exit_status[0])


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


def drain_seconds(grace_s: float) -> float:
    """How long a stop may let the requests in flight come back: at the time limit,
    ``DRAIN_MAX_S`` at most and until ``_EXIT_RESERVE_S`` before the deadline (half the time
    left, when that is less); else 0, the stop is at once."""
    left = _time_left()
    if left is None or not _at_time_limit(left, grace_s):
        return 0.0
    return max(0.0, min(DRAIN_MAX_S, left - min(_EXIT_RESERVE_S, left / 2)))


def stop_reason(signum: int, grace_s: float) -> str:
    """``time limit`` when SLURM's deadline is this close, else ``interrupted``."""
    if _at_time_limit(_time_left(), grace_s):
        return (
            "time limit: SLURM ends this task at execution_params.time_limit; it stopped at "
            "its checkpoint and 'mmirage retry' resumes it"
        )
    return "interrupted"
