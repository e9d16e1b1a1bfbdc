"""Draw which failure, if any, to inject into a request; seeded for reproducible runs."""

from __future__ import annotations

import random
from enum import Enum

from provider_emulator.config import Faults


class Fault(Enum):
    RESET = "reset"  # close the connection without an answer
    HANG = "hang"  # answer only after hang_s
    RATE_LIMIT = "429"
    RATE_LIMIT_BUDGET_LEFT = "429_budget_left"  # a sporadic 429: the headers show budget left
    INSUFFICIENT_QUOTA = "insufficient_quota"
    SERVER_ERROR = "500"
    UNAVAILABLE = "503"
    OVERLOADED = "529"


_RATES: tuple[tuple[Fault, str], ...] = (
    (Fault.RESET, "rate_reset"),
    (Fault.HANG, "rate_hang"),
    (Fault.RATE_LIMIT, "rate_429"),
    (Fault.RATE_LIMIT_BUDGET_LEFT, "rate_429_budget_left"),
    (Fault.INSUFFICIENT_QUOTA, "rate_insufficient_quota"),
    (Fault.SERVER_ERROR, "rate_500"),
    (Fault.UNAVAILABLE, "rate_503"),
    (Fault.OVERLOADED, "rate_529"),
)


class FaultInjector:
    """One uniform draw per request against the cumulative rates: a deterministic sequence
    for a given seed and request order."""

    __slots__ = ("_rng", "_thresholds", "enabled")

    def __init__(self, faults: Faults, seed: int | None) -> None:
        self._rng = random.Random(seed)
        self._thresholds: list[tuple[float, Fault]] = []
        total = 0.0
        for fault, name in _RATES:
            rate = getattr(faults, name)
            if rate > 0:
                total += rate
                self._thresholds.append((total, fault))
        self.enabled = bool(self._thresholds)

    def draw(self) -> Fault | None:
        if not self.enabled:
            return None
        x = self._rng.random()
        for threshold, fault in self._thresholds:
            if x < threshold:
                return fault
        return None
