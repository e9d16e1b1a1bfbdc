"""Shared bits of the benchmark scripts (not tests: they print figures and ratios)."""

from __future__ import annotations

import resource
import statistics
import sys
from collections.abc import Callable


def peak_rss_mb() -> float:
    """This process's peak resident set size, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median_of(runs: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(runs))


def report(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(name) for name, _ in rows)
    print(f"\n== {title}")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    sys.stdout.flush()
