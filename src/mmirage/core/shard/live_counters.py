"""What a shard's live requests came to, as people read it: retries by cause, time the pool
spent cooling down after rate limits, tokens, and the cost so far; the progress line and the
shard's summary line built from them.

Cost is at live (list) prices, from the run's price book (``process.batch.cost``: an ``llm``
processor's ``price_per_mtok``, ``MMIRAGE_PRICES``, the shipped table). A model with no known
price makes the cost unknown rather than a misleading partial sum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm_kit.request_stats import RATE_LIMITED, RETRY_CAUSES
from mmirage.core.process.batch.cost import PRICES_ENV, PriceBook, format_usd

if TYPE_CHECKING:
    from mmirage.core.process.base import Processor


def _no_retries() -> dict[str, int]:
    return dict.fromkeys(RETRY_CAUSES, 0)


@dataclass
class RequestTotals:
    """The live requests of one shard (or of several, ``plus``) since it started."""

    live: bool = False  # some processor sends live requests (else nothing below is shown)
    retries: dict[str, int] = field(default_factory=_no_retries)
    cooldown_seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0  # None: a model's price is not known
    unpriced: list[str] = field(default_factory=list)  # those models

    @property
    def retried(self) -> int:
        return sum(self.retries.values())

    @property
    def rate_limited(self) -> int:
        return self.retries.get(RATE_LIMITED, 0)

    def plus(self, other: RequestTotals) -> RequestTotals:
        cost = (
            None
            if self.cost_usd is None or other.cost_usd is None
            else self.cost_usd + other.cost_usd
        )
        return RequestTotals(
            self.live or other.live,
            {c: self.retries.get(c, 0) + other.retries.get(c, 0) for c in RETRY_CAUSES},
            self.cooldown_seconds + other.cooldown_seconds,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            cost,
            sorted({*self.unpriced, *other.unpriced}),
        )

    def as_json(self) -> dict[str, Any]:
        """For ``--stats``, ``mmirage stats`` and the parallel parent's records."""
        return {
            "live": self.live,
            "retries": dict(self.retries),
            "cooldown_seconds": round(self.cooldown_seconds, 3),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            # None: a model without a price, or no live request (a batch cost is the merge's).
            "cost_usd": None if self.cost_usd is None or not self.live else round(self.cost_usd, 6),
            "unpriced": list(self.unpriced),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestTotals:
        retries = data.get("retries") or {}
        cost = data.get("cost_usd")
        return cls(
            bool(data.get("live")),
            {c: int(retries.get(c) or 0) for c in RETRY_CAUSES},
            float(data.get("cooldown_seconds") or 0.0),
            int(data.get("input_tokens") or 0),
            int(data.get("output_tokens") or 0),
            None if cost is None else float(cost),
            [str(m) for m in data.get("unpriced") or ()],
        )


@dataclass
class _Start:
    retries: dict[str, int]
    cooldown: float
    input_tokens: int
    output_tokens: int


class RequestCounter:
    """The live requests of ``procs`` from now on (what they counted before is left out)."""

    def __init__(self, procs: Iterable[Processor], prices: PriceBook) -> None:
        self.prices = prices
        live = [(p, s) for p in procs if (s := p.request_stats()) is not None]
        self._starts = [
            (p, _Start(dict(s.retries), s.cooldown_seconds, s.input_tokens, s.output_tokens))
            for p, s in live
        ]

    def totals(self) -> RequestTotals:
        total = RequestTotals(live=bool(self._starts))
        for proc, start in self._starts:
            stats = proc.request_stats()  # fills in the cool-down from its rate limiter
            if stats is None:
                continue
            tokens_in = stats.input_tokens - start.input_tokens
            tokens_out = stats.output_tokens - start.output_tokens
            cost = self.prices.usage_cost(stats.model, tokens_in, tokens_out, batch=False)
            one = RequestTotals(
                True,
                {c: stats.retries.get(c, 0) - start.retries.get(c, 0) for c in RETRY_CAUSES},
                stats.cooldown_seconds - start.cooldown,
                tokens_in,
                tokens_out,
                cost,
                [] if cost is not None else [stats.model],
            )
            total = total.plus(one)
        return total


def eta_text(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``; ``?`` while no rate is known."""
    if seconds is None:
        return "?"
    whole = int(seconds + 0.5)
    h, m, s = whole // 3600, whole % 3600 // 60, whole % 60
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s" if m else f"{s}s"


def cost_text(totals: RequestTotals) -> str:
    if totals.cost_usd is None:
        return "cost unknown"
    return f"cost ~{format_usd(totals.cost_usd)}"


def request_parts(totals: RequestTotals) -> list[str]:
    """The request counters of a progress line (none when no request is live)."""
    if not totals.live:
        return []
    return [
        f"{totals.retried:,} retried",
        f"{totals.rate_limited:,} rate-limited",
        f"tokens {totals.input_tokens:,} in / {totals.output_tokens:,} out",
        cost_text(totals),
    ]


def progress_line(
    done: int, total: int | None, failed: int, rate: float, totals: RequestTotals
) -> str:
    """``1,200/5,000 rows (24%), 41.2 rows/s, ETA 1m32s, 3 failed, 12 retried, 8
    rate-limited, tokens 120,000 in / 30,000 out, cost ~$0.0123``."""
    if total:
        rows = f"{done:,}/{total:,} rows ({100 * done // total}%)"
        eta = eta_text(max(0, total - done) / rate if rate > 0 else None)
    else:
        rows, eta = f"{done:,} rows", "?"
    parts = [rows, f"{rate:,.1f} rows/s", f"ETA {eta}", f"{failed:,} failed"]
    return ", ".join(parts + request_parts(totals))


def retries_summary(totals: RequestTotals) -> str:
    """The shard's end line: ``requests retried: 12 (429: 8, 5xx: 3, timeout: 1,
    connection: 0); 4.2 s cooling down after rate limits; tokens 120,000 in / 30,000 out, cost
    ~$0.0123 at list prices``."""
    shown = [c for c in RETRY_CAUSES if c != "other" or totals.retries.get(c)]
    causes = ", ".join(f"{c}: {totals.retries.get(c, 0):,}" for c in shown)
    cost = (
        f"{cost_text(totals)} at list prices"
        if totals.cost_usd is not None
        else f"cost unknown (no price for {', '.join(totals.unpriced)}: see {PRICES_ENV})"
    )
    return (
        f"requests retried: {totals.retried:,} ({causes}); "
        f"{totals.cooldown_seconds:.1f} s cooling down after rate limits; "
        f"tokens {totals.input_tokens:,} in / {totals.output_tokens:,} out, {cost}"
    )


def summed(reports: Iterable[Mapping[str, Any] | None]) -> RequestTotals:
    """The ``requests`` of several shards' reports, added up (reports without any left out)."""
    total = RequestTotals()
    for report in reports:
        if report and report.get("live"):
            total = total.plus(RequestTotals.from_json(report))
    return total


def aggregate_json(totals: RequestTotals) -> dict[str, Any]:
    """The run's live requests for ``--stats`` and ``mmirage stats`` (the aggregate's
    ``requests``, shaped as each shard's): retries by cause, cool-down, tokens, cost."""
    return {"requests": totals.as_json()}
