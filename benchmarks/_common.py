"""Shared bits of the benchmark scripts (not tests: they print figures and ratios)."""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import subprocess
import sys
from collections.abc import Callable, Coroutine
from typing import Any


def peak_rss_mb(who: int = resource.RUSAGE_SELF) -> float:
    """This process's peak resident set size, in MB (Linux reports KiB); with
    ``resource.RUSAGE_CHILDREN``, the largest of its ended children's."""
    return resource.getrusage(who).ru_maxrss / 1024


def run_child(argv: list[str], ok_codes: tuple[int, ...] = (0,)) -> tuple[str, float]:
    """Run a child process to its end: (its stdout, its peak RSS in MB, from wait4)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in ok_codes:
        raise subprocess.CalledProcessError(proc.returncode, argv, out)
    return out, usage.ru_maxrss / 1024


def run_async(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run on uvloop when it is installed: both sides of a comparison share the loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def median_of(runs: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(runs))


def report(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n== {title}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    sys.stdout.flush()
