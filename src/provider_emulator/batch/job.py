"""A batch job, provider-neutral: its fate, its clock, its counters.

A job's state is read off the clock rather than stored: with ``batch_delay_s = D`` it
validates for the first 10 % of D, runs until 90 %, finalizes until D, and has ended once its
results are written and D has passed. Its fate (normal, failed, expired) is drawn at creation
from the seeded stream, so a seeded emulator replays the same story.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from provider_emulator.batch.files import StoredFile
from provider_emulator.config import EmulatorConfig

VALIDATING_SHARE = 0.1  # of batch_delay_s
FINALIZING_SHARE = 0.9
CANCELLING_SHARE = 0.1  # cancelling lasts this share of batch_delay_s
INVALID_SHARE = 0.25  # of injected item errors: a 400 rather than a 500


class Fate(Enum):
    NORMAL = "normal"
    FAILED = "failed"
    EXPIRED = "expired"


class Outcome(Enum):
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class Phase(Enum):
    VALIDATING = "validating"
    RUNNING = "running"
    FINALIZING = "finalizing"
    CANCELLING = "cancelling"
    ENDED = "ended"


class ItemFault(Enum):
    """An injected per-request failure: a provider 500 (retryable) or a 400 (not)."""

    SERVER = "server"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Limits:
    max_requests: int | None
    max_bytes: int


# Each provider's documented per-batch limits; EmulatorConfig.batch_max_* replace them all.
PROVIDER_LIMITS: dict[str, Limits] = {
    "openai": Limits(50_000, 200 * 1024**2),
    "anthropic": Limits(100_000, 256 * 1024**2),
    "gemini-inline": Limits(None, 20 * 1024**2),
    "gemini-file": Limits(None, 2 * 1024**3),
}


def limits_for(kind: str, config: EmulatorConfig) -> Limits:
    default = PROVIDER_LIMITS[kind]
    return Limits(
        config.batch_max_requests or default.max_requests,
        config.batch_max_bytes or default.max_bytes,
    )


class _Share:
    """Fires for ``rate`` of its calls, evenly spread from a seeded phase: any run of n calls
    holds rate·n of them, give or take one, so even a job split into three batches sees its
    share of failures (independent draws would often see none)."""

    def __init__(self, rate: float, phase: float) -> None:
        self._rate = rate
        self._level = phase

    def fire(self) -> bool:
        before = self._level
        self._level += self._rate
        return math.floor(self._level) > math.floor(before)


class Fates:
    """The seeded draws of the batch path: each job's fate and the seed of its own items."""

    def __init__(self, config: EmulatorConfig) -> None:
        self._rng = random.Random(None if config.seed is None else config.seed + 2)
        failing, expiring = config.batch_failure_rate, config.batch_expire_rate
        self._faulty = _Share(min(1.0, failing + expiring), self._rng.random())
        self._fails = _Share(failing / (failing + expiring or 1.0), self._rng.random())

    def draw(self) -> tuple[Fate, int]:
        seed = self._rng.getrandbits(64)
        if not self._faulty.fire():
            return Fate.NORMAL, seed
        return (Fate.FAILED if self._fails.fire() else Fate.EXPIRED), seed


@dataclass(eq=False)
class BatchJob:
    """One job. The runner fills in the counters and the outcome; the routes read them.

    ``options`` holds what the provider's create call said (endpoint, metadata, model, display
    name); ``outputs`` the files the runner produced, by role (``output``, ``error``,
    ``results``); ``errors`` the whole-batch failure details.
    """

    id: str
    provider: str
    delay_s: float
    fate: Fate
    seed: int
    options: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    total: int = 0
    validated_at: float | None = None
    cancel_at: float | None = None
    outcome: Outcome | None = None
    ended_at: float | None = None  # the end is visible from then on
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    outputs: dict[str, StoredFile] = field(default_factory=dict)
    paths: list[Path] = field(default_factory=list)  # private files, removed with the job
    task: asyncio.Task[None] | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    # -- the clock ---------------------------------------------------------------------------

    def share(self, moment: float) -> float:
        """How far along the job is at ``moment`` (0..1); a zero delay is done at once."""
        if self.delay_s <= 0:
            return 1.0
        return min(1.0, max(0.0, (moment - self.created_at) / self.delay_s))

    def due(self, share: float) -> float:
        return self.created_at + share * self.delay_s

    def items_due(self, moment: float) -> int:
        """Requests finished by ``moment`` when work keeps pace with the clock."""
        return math.floor(self.total * self.share(moment))

    def ended(self, now: float) -> bool:
        return self.ended_at is not None and now >= self.ended_at

    def phase(self, now: float) -> Phase:
        if self.ended(now):
            return Phase.ENDED
        if self.cancel_at is not None:
            return Phase.CANCELLING
        if self.validated_at is None or now < self.due(VALIDATING_SHARE):
            return Phase.VALIDATING
        if now < self.due(FINALIZING_SHARE) or self.fate is Fate.EXPIRED:
            return Phase.RUNNING
        return Phase.FINALIZING

    @property
    def running_since(self) -> float:
        """When validation ended (its share of the delay, or the real scan, whichever is later)."""
        return max(self.due(VALIDATING_SHARE), self.validated_at or self.created_at)

    @property
    def finalizing_since(self) -> float:
        return max(self.due(FINALIZING_SHARE), self.running_since)

    # -- what the runner and the routes do ---------------------------------------------------

    def cancel(self, now: float) -> None:
        """Ask the work to stop; a no-op once the outcome is known or a cancel is under way."""
        if self.outcome is None and self.cancel_at is None:
            self.cancel_at = now
            self.wake.set()

    def finish(self, outcome: Outcome, planned_end: float) -> None:
        """Record the outcome; it shows from ``planned_end`` on (or now, if work ran later)."""
        self.outcome = outcome
        self.ended_at = max(planned_end, time.time())

    def planned_end(self, outcome: Outcome) -> float:
        if outcome is Outcome.FAILED:
            return self.due(VALIDATING_SHARE)
        if outcome is Outcome.CANCELLED and self.cancel_at is not None:
            return self.cancel_at + CANCELLING_SHARE * self.delay_s
        return self.due(1.0)

    async def sleep(self, seconds: float) -> None:
        """Sleep, waking early when the job is cancelled."""
        if seconds > 0 and not self.wake.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), seconds)

    def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
