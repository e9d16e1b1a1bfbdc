"""Why a shard was stopped by a signal, recorded in its status: a SLURM task that reached its
time limit is told so ``--signal`` seconds before the end, and says "time limit"."""

from __future__ import annotations

import os
import re
import time

# Set by the SLURM job script: when SLURM will end the task (epoch seconds).
DEADLINE_ENV = "MMIRAGE_SLURM_DEADLINE"
_SLACK_S = 30.0  # the signal comes `signal_grace_seconds` before the deadline, give or take
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


# Signals are process-wide: the handler notes why here, because the exception it raises may
# reach the shard's coroutine only as a CancelledError (asyncio cancels it on the way out).
_noted: list[str] = []


def note(reason: str) -> None:
    _noted.append(reason)


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
