"""Rows/s, tokens/s and cost over time, from the shards' own start and end times.

No run writes a time series, and the page must show one after a restart of the viewer too,
so each shard's rows (and tokens, and cost) are spread evenly over the time it ran (start to
finish, or to its last heartbeat): the sum over shards is the pipeline's rate per time bin.
A shard is coarse on its own; a pipeline of many shards gives a faithful curve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from mmirage.view.shards import ShardLine

BINS = 60


@dataclass(frozen=True)
class Timeline:
    start: float  # seconds since the epoch of the first bin's start
    width: float  # seconds per bin
    rows_per_s: list[float]
    tokens_per_s: list[float]
    cost_usd: list[float]  # cumulative: 0 at the start, then at each bin's end

    @property
    def empty(self) -> bool:
        return not self.rows_per_s


def _spread(
    into: list[float], amount: float, begin: float, end: float, t0: float, w: float
) -> None:
    """Add ``amount`` over [begin, end], each bin getting its share of the overlap."""
    span = max(end - begin, 1e-9)
    first = max(0, int((begin - t0) / w))
    last = min(len(into) - 1, int((end - t0) / w))
    for i in range(first, last + 1):
        lo, hi = t0 + i * w, t0 + (i + 1) * w
        overlap = min(hi, end) - max(lo, begin)
        if span <= 1e-9:
            overlap = 1.0 if i == first else 0.0
            into[i] += amount * overlap
        elif overlap > 0:
            into[i] += amount * overlap / span


def timeline(lines: Sequence[ShardLine], bins: int = BINS) -> Timeline:
    """The pipeline's rates and cost per time bin (worked out again only when a line changed)."""
    return _timeline(tuple(lines), bins)


@lru_cache(maxsize=4)
def _timeline(lines: tuple[ShardLine, ...], bins: int) -> Timeline:
    ran = [s for s in lines if s.started is not None and s.ended is not None]
    if not ran:
        return Timeline(0.0, 1.0, [], [], [])
    t0 = min(s.started or 0.0 for s in ran)
    t1 = max(max(s.ended or 0.0 for s in ran), t0 + 1.0)
    width = (t1 - t0) / bins
    rows, tokens, cost = [0.0] * bins, [0.0] * bins, [0.0] * bins
    for s in ran:
        begin, end = s.started or t0, max(s.ended or t0, s.started or t0)
        added = max(0, s.rows_done - s.baseline)
        _spread(rows, added, begin, end, t0, width)
        share = added / s.rows_done if s.rows_done else 1.0
        _spread(tokens, (s.input_tokens + s.output_tokens) * share, begin, end, t0, width)
        if s.cost_usd:
            _spread(cost, s.cost_usd, begin, end, t0, width)
    running = 0.0
    cumulative = [0.0]  # nothing spent before the first shard started
    for c in cost:
        running += c
        cumulative.append(running)
    return Timeline(
        start=t0,
        width=width,
        rows_per_s=[r / width for r in rows],
        tokens_per_s=[t / width for t in tokens],
        cost_usd=cumulative,
    )
