"""How a shard process stops: SIGTERM unwinds like Ctrl-C, and a child shard dies with the
``mmirage run`` that started it."""

from __future__ import annotations

import os
import signal
import sys

PARENT_PID_ENV = "MMIRAGE_PARENT_PID"  # set for a child shard process: die with that parent


def sigterm_as_exit(grace_s: float = 0.0) -> None:
    """SIGTERM (SLURM, kill, a stopped parent) unwinds like Ctrl-C, so the shard records
    "failed" (or "time limit", near a SLURM task's deadline), not "running". Only the first
    one: a second SIGTERM (a child can get one from its dying parent and one from whoever
    stops it) would cut short the cleanup that records the shard's state. While a shard's
    coroutine runs, the signal cancels it at its next await instead (``stop.stop_shard``),
    near the time limit after letting its requests in flight come back; a second signal then
    cuts that wait short."""
    from mmirage.core.shard.stop import drain_seconds, hurry_stop, note, stop_reason, stop_shard

    unwinding = False

    def handler(signum: int, frame: object) -> None:
        nonlocal unwinding
        if unwinding:
            hurry_stop()
            return
        unwinding = True
        reason = stop_reason(signum, grace_s)
        if stop_shard(reason, 128 + signum, drain_seconds(grace_s)):
            return
        note(reason)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def die_with_parent() -> None:
    """In a child shard process: get SIGTERM when the parent ``run`` dies, even by SIGKILL, so
    no shard keeps running (and paying) after the command that started it is gone."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        raise SystemExit(128 + signal.SIGTERM)
