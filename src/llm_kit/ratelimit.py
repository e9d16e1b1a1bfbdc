"""Client-side pacing: requests per minute, tokens per minute, and a shared cool-down.

A 429 pauses every worker only when the provider's headers say the budget is spent
(``budget_spent``); a sporadic one, with budget left or no rate-limit headers at all, is a
momentary refusal: that request backs off, the others go on.

Requests are spaced evenly (one every 60/rpm seconds) rather than allowed to burst, so that no
60-second window ever holds more than the budget. Tokens are reserved from a refilling bucket
before a call (estimated input + max output) and settled with the real usage afterwards. Both
budgets start from the configuration and are tightened by what the provider's headers say.
"""

from __future__ import annotations

import asyncio
import logging
import time

from llm_kit.types import RateLimitInfo

logger = logging.getLogger(__name__)


class RateLimiter:
    def __init__(self, rpm: int | None = None, tpm: int | None = None) -> None:
        self.rpm = rpm
        self.tpm = tpm
        self._next_slot = 0.0  # monotonic time at which the next request may leave
        self._tokens = float(tpm) if tpm else 0.0
        self._tokens_at = time.monotonic()
        self._paused_until = 0.0
        self.cooled_down_seconds = 0.0

    @property
    def idle(self) -> bool:
        """True when nothing limits dispatch: acquire() then returns at once."""
        return self.rpm is None and self.tpm is None and self._paused_until <= time.monotonic()

    @property
    def limits(self) -> str:
        """The budgets in force (configured, or learned from the provider's headers)."""
        known = [
            f"{v:,} {unit}/min" for v, unit in ((self.rpm, "requests"), (self.tpm, "tokens")) if v
        ]
        if not known:
            return "no limit known: none configured, none in the provider's headers"
        return "limits now: " + ", ".join(known)

    async def acquire(self, tokens: int) -> int:
        """Wait for a request slot and ``tokens`` tokens; return the tokens reserved."""
        if self.idle:
            return 0
        now = time.monotonic()
        start = max(now, self._paused_until)
        if self.rpm:
            # Slots are handed out in call order without awaiting: fair and lock-free.
            start = max(start, self._next_slot)
            self._next_slot = start + 60.0 / self.rpm
        reserved = 0
        if self.tpm:
            reserved = min(tokens, self.tpm)
            self._refill(now)
            # The bucket may go into debt; the debt is the wait of whoever caused it.
            self._tokens -= reserved
            if self._tokens < 0:
                start = max(start, now + (-self._tokens) * 60.0 / self.tpm)
        delay = start - now
        if delay > 0:
            await asyncio.sleep(delay)
        return reserved

    def settle(self, reserved: int, used: int) -> None:
        """Give back what a request reserved but did not use (or charge what it overran)."""
        if self.tpm and reserved:
            self._refill(time.monotonic())
            self._tokens = min(float(self.tpm), self._tokens + reserved - used)

    def cool_down(self, seconds: float) -> None:
        """After a 429 of a spent budget every worker waits: hammering a provider whose budget
        is spent only earns more 429s."""
        now = time.monotonic()
        until = now + seconds
        if until > self._paused_until:
            # Wall time paused, overlapping pauses counted once (for the run's report).
            if self._paused_until <= now:
                logger.info("rate limited: every request waits %.2f s (%s)", seconds, self.limits)
            self.cooled_down_seconds += until - max(now, self._paused_until)
            self._paused_until = until
            self._next_slot = max(self._next_slot, until)

    def observe(self, info: RateLimitInfo) -> None:
        """Tighten the budgets to the provider's limits; pause when its budget is spent."""
        if info.limit_requests and (self.rpm is None or info.limit_requests < self.rpm):
            self.rpm = info.limit_requests
        if info.limit_tokens and (self.tpm is None or info.limit_tokens < self.tpm):
            if self.tpm is None:
                self._tokens = float(info.limit_tokens)
                self._tokens_at = time.monotonic()
            self.tpm = info.limit_tokens
        if info.remaining_requests == 0 and self.rpm:
            self.cool_down(60.0 / self.rpm)
        if info.remaining_tokens is not None and self.tpm:
            self._refill(time.monotonic())
            self._tokens = min(self._tokens, float(info.remaining_tokens))

    def _refill(self, now: float) -> None:
        assert self.tpm
        self._tokens = min(
            float(self.tpm), self._tokens + (now - self._tokens_at) * self.tpm / 60.0
        )
        self._tokens_at = now


def budget_spent(info: RateLimitInfo | None) -> bool:
    """Whether a 429's rate-limit headers say the budget is spent (a remaining count of 0).

    Headers that show budget left, or no headers at all, make it a sporadic 429: a momentary
    refusal (an overloaded replica, a burst) that pausing every worker would only turn into
    idle time for the whole pool."""
    return info is not None and (info.remaining_requests == 0 or info.remaining_tokens == 0)
