"""Why a shard was stopped by a signal, recorded in its status: a SLURM task that reached its
time limit is told so ``--signal`` seconds before the end, and says "time limit".

While a shard's coroutine runs, a stop signal cancels it at its next ``await`` instead of
raising where the interpreter happens to be: a journal rewrite, a checkpoint or a library's
callback (aiohttp turns any exception in its parser into a payload error, which would be
retried) is never cut in half, and the shard records why it stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

# Set by the SLURM job script: when SLURM will end the task (epoch seconds).
DEADLINE_ENV = "MMIRAGE_SLURM_DEADLINE"
# SLURM sends the --signal "up to 60 seconds earlier than specified" (sbatch(1)), never later
# than the deadline itself.
_SLACK_S = 60.0
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


# The shard coroutine a stop signal cancels, with its loop; and the exit status it asked for.
_shard: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]] = []
_exit_status: list[int] = []


@contextlib.contextmanager
def cancelled_on_stop() -> Iterator[None]:
    """Inside a shard's coroutine: a stop signal meanwhile cancels it (``stop_shard``)."""
    task = asyncio.current_task()
    assert task is not None, "called outside a coroutine"
    _exit_status.clear()
    _shard.append((asyncio.get_running_loop(), task))
    try:
        yield
    finally:
        _shard.pop()


def stop_shard(reason: str, exit_status: int) -> bool:
    """From a signal handler: when a shard's coroutine runs, note ``reason`` and cancel it at
    its next await (the loop runs the cancel, not the handler); whether one was running."""
    if not _shard:
        return False
    note(reason)
    _exit_status.append(exit_status)
    loop, task = _shard[-1]
    loop.call_soon_threadsafe(task.cancel)
    return True


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


def stop_reason(signum: int, grace_s: float) -> str:
    """``time limit`` when SLURM's deadline is this close, else ``interrupted``."""
    deadline = os.environ.get(DEADLINE_ENV)
    try:
        left = float(deadline) - time.time() if deadline else None
    except ValueError:
        left = None
    if left is not None and left <= grace_s + _SLACK_S:
        return (
            "time limit: SLURM ends this task at execution_params.time_limit; it stopped at "
            "its checkpoint and 'mmirage retry' resumes it"
        )
    return "interrupted"
