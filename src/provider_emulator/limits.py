"""Per-minute budgets as continuously refilling token buckets, the way providers meter them."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta


class TokenBucket:
    """Holds up to ``limit`` units and refills ``limit`` per minute, continuously."""

    __slots__ = ("_stamp", "available", "limit", "rate")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rate = limit / 60.0  # units per second
        self.available = float(limit)
        self._stamp = time.monotonic()

    def refill(self, now: float) -> float:
        self.available = min(self.limit, self.available + (now - self._stamp) * self.rate)
        self._stamp = now
        return self.available

    def wait_for(self, cost: float, now: float) -> float:
        """Seconds until ``cost`` units are available (0 when they are now)."""
        missing = min(cost, self.limit) - self.refill(now)
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, cost: float) -> None:
        # Requests larger than the whole bucket are clamped so that they can pass one day.
        self.available -= min(cost, self.limit)

    def until_full(self) -> float:
        return (self.limit - self.available) / self.rate


@dataclass(slots=True)
class BudgetState:
    """What the rate-limit headers report, read right after a request was charged or refused."""

    request_limit: int | None
    requests_left: int
    requests_reset_s: float
    token_limit: int | None
    tokens_left: int
    tokens_reset_s: float
    retry_after_s: float = 0.0  # > 0 when the request was refused
    refused_by: str = ""  # "requests" or "tokens"


class FamilyLimiter:
    """The request and token buckets of one provider family."""

    __slots__ = ("requests", "tokens")

    def __init__(self, rpm: int | None, tpm: int | None) -> None:
        self.requests = TokenBucket(rpm) if rpm else None
        self.tokens = TokenBucket(tpm) if tpm else None

    def admit(self, token_cost: int) -> BudgetState:
        """Charge one request of ``token_cost`` tokens, or refuse it and say how long to wait."""
        now = time.monotonic()
        req_wait = self.requests.wait_for(1, now) if self.requests else 0.0
        tok_wait = self.tokens.wait_for(token_cost, now) if self.tokens else 0.0
        wait = max(req_wait, tok_wait)
        if wait <= 0:
            if self.requests:
                self.requests.take(1)
            if self.tokens:
                self.tokens.take(token_cost)
        state = BudgetState(
            self.requests.limit if self.requests else None,
            math.floor(self.requests.available) if self.requests else 0,
            self.requests.until_full() if self.requests else 0.0,
            self.tokens.limit if self.tokens else None,
            math.floor(self.tokens.available) if self.tokens else 0,
            self.tokens.until_full() if self.tokens else 0.0,
        )
        if wait > 0:
            state.retry_after_s = wait
            state.refused_by = "requests" if req_wait >= tok_wait else "tokens"
        return state


def go_duration(seconds: float) -> str:
    """OpenAI's reset format, Go's time.Duration style: ``12ms``, ``1s``, ``6m0s``, ``1h2m3.5s``."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{secs:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{int(hours)}h{int(minutes)}m{text}"
    if minutes:
        return f"{int(minutes)}m{text}"
    return text


def rfc3339_in(seconds: float) -> str:
    """Anthropic's reset format: the UTC time, ``seconds`` from now, as ``2025-08-21T12:40:59Z``."""
    moment = datetime.now(UTC) + timedelta(seconds=seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
