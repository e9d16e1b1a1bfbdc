"""How a shard process stops: the first SIGINT or SIGTERM (Ctrl-C, kill, ``scancel``, a job
manager) stops it gracefully, a second one at once; a child shard of a parallel run stops when
its parent says so, and when the ``mmirage run`` that started it dies."""

from __future__ import annotations

import os
import signal
import sys

PARENT_PID_ENV = "MMIRAGE_PARENT_PID"  # set for a child shard process: die with that parent

# A parallel run tells its children to stop with these rather than passing its own signal on:
# a child often gets that signal itself too (a terminal's Ctrl-C reaches the whole process
# group, scancel every process of the job), and a second SIGINT or SIGTERM cuts the drain short.
# PARENT_STOP is idempotent with a stop under way; it is also what a dying parent sends.
PARENT_STOP = signal.SIGUSR1  # stop gracefully, as after a first signal
PARENT_HURRY = signal.SIGUSR2  # stop at once, as after a second signal
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignored(signum: int) -> bool:
    """Whether this process ignores ``signum``. One started with Ctrl-C ignored (``cmd &`` in
    a script: the shell keeps the script's Ctrl-C from its background jobs) keeps ignoring
    it, as Python itself does: a stop handler would undo what the shell asked for."""
    return signal.getsignal(signum) is signal.SIG_IGN


def stop_on_signals(stop_grace_s: float, signal_grace_s: float = 0.0) -> None:
    """SIGINT and SIGTERM stop this process gracefully (``core.shard.stop``): while a shard's
    coroutine runs, the signal cancels it at its next await, after letting its requests in
    flight come back for up to ``stop_grace_s`` seconds (less in a SLURM task:
    ``stop.drain_seconds``); the shard records "interrupted" (or "time limit", within
    ``signal_grace_s`` of a SLURM task's deadline) and the process exits 130 or 143 with one
    sentence on stderr. Outside a shard's coroutine it exits at once. A second signal cuts the
    drain short but never the cleanup that records the shard's state. A child shard also obeys
    its parent's ``PARENT_STOP`` and ``PARENT_HURRY``. A signal this process ignores
    (``ignored``) stays ignored."""
    from mmirage.core.shard.stop import (
        drain_seconds,
        exit_at_once,
        hurry_stop,
        signal_name,
        stop_reason,
        stop_shard,
    )

    stopping = False
    signals = 0  # SIGINTs and SIGTERMs received

    def begin(signum: int, cause: str) -> None:
        nonlocal stopping
        stopping = True
        reason = stop_reason(signum, signal_grace_s)
        if not stop_shard(reason, 128 + signum, drain_seconds(stop_grace_s), cause):
            exit_at_once(reason, 128 + signum, cause)

    def on_signal(signum: int, frame: object) -> None:
        nonlocal signals
        signals += 1
        if not stopping:
            begin(signum, signal_name(signum))
        elif signals > 1:  # a parent's PARENT_STOP and one signal are one stop, not two
            hurry_stop()

    def on_parent_stop(signum: int, frame: object) -> None:
        if not stopping:
            begin(signal.SIGTERM, "its parent run's stop")

    def on_parent_hurry(signum: int, frame: object) -> None:
        if not stopping:
            begin(signal.SIGTERM, "its parent run's stop")
        hurry_stop()

    for signum in STOP_SIGNALS:
        if not ignored(signum):
            signal.signal(signum, on_signal)
    if os.environ.get(PARENT_PID_ENV):
        signal.signal(PARENT_STOP, on_parent_stop)
        signal.signal(PARENT_HURRY, on_parent_hurry)


def die_with_parent() -> None:
    """In a child shard process: stop (``PARENT_STOP``) when the parent ``run`` dies, even by
    SIGKILL, so no shard keeps running (and paying) after the command that started it is
    gone. Call it after ``stop_on_signals``: without its handler the signal kills at once."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, PARENT_STOP)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        raise SystemExit(128 + signal.SIGTERM)
