"""Shared bits of the benchmark scripts (not tests: they print figures and ratios)."""

from __future__ import annotations

import asyncio
import resource
import statistics
import sys
from collections.abc import Callable, Coroutine
from typing import Any


def peak_rss_mb() -> float:
    """This process's peak resident set size, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
