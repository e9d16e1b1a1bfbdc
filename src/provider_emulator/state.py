"""What one emulator process holds while it runs: config, responder, budgets, faults, stats,
and the batch jobs with their files."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
from typing import Any

from provider_emulator.batch.damaged_downloads import DamagedDownloads
from provider_emulator.batch.job import Fates
from provider_emulator.batch.runner import Runner
from provider_emulator.batch.store import BatchStore
from provider_emulator.config import EmulatorConfig
from provider_emulator.faults import FaultInjector
from provider_emulator.limits import FamilyLimiter
from provider_emulator.responder import OffSchemaResponder, Responder, make_responder

FAMILIES = ("openai", "anthropic", "gemini")


class Stats:
    """Counters for tests and benchmarks. Per process: with several workers, each has its own.

    ``requests`` counts requests as they arrive, before their answer: a request whose client
    gave up meanwhile was still paid for, and a test that resets the stats between two runs must
    not find the first run's last request counted in the second one's. ``status`` counts answers
    by HTTP status, plus ``"reset"`` for dropped connections, and ``families`` by provider;
    ``times`` (only when ``record_times``) holds the wall-clock time of every request admitted
    past the rate limiter; ``batches`` the batch jobs created, by provider. Batch API calls
    (files, batches, results) count as requests like any other.
    """

    __slots__ = ("batches", "families", "record_times", "requests", "started", "status", "times")

    def __init__(self, record_times: bool) -> None:
        self.record_times = record_times
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.status: dict[str, int] = {}
        self.families: dict[str, int] = {}
        self.times: list[float] = []
        self.batches: dict[str, int] = {}
        self.started = time.time()

    def count(self, family: str, status: int | str) -> None:
        """A request answered at once."""
        self.arrived()
        self.answered(family, status)

    def arrived(self) -> None:
        self.requests += 1

    def answered(self, family: str, status: int | str) -> None:
        key = str(status)
        self.status[key] = self.status.get(key, 0) + 1
        self.families[family] = self.families.get(family, 0) + 1

    def count_batch(self, provider: str) -> None:
        self.batches[provider] = self.batches.get(provider, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pid": os.getpid(),
            "requests": self.requests,
            "status": dict(self.status),
            "families": dict(self.families),
            "batches": dict(self.batches),
            "started": self.started,
        }
        if self.record_times:
            out["times"] = list(self.times)
        return out


class EmulatorState:
    """Shared by every route of one app; only ever touched from the app's event loop."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.responder: Responder = make_responder(config.responder)
        if config.invalid_json != "never":
            self.responder = OffSchemaResponder(self.responder, config.invalid_json)
        # Every live request, when asked for (EmulatorConfig.record_requests); None: not kept.
        self.recorded: list[dict[str, Any]] | None = [] if config.record_requests else None
        self.faults = FaultInjector(config.faults, config.seed)
        self.stats = Stats(config.record_times)
        self.batches = BatchStore()
        self.fates = Fates(config)
        self.result_downloads = DamagedDownloads(config.batch_damaged_downloads)
        self.runner = Runner(
            self.batches, config.batch_item_error_rate, config.batch_expire_done_fraction
        )
        self._latency_rng = random.Random(None if config.seed is None else config.seed + 1)
        self._ids = itertools.count(1)
        self._id_prefix = f"{os.getpid():x}"
        self._stopping = asyncio.Event()
        limited = config.rpm is not None or config.tpm is not None
        self.limiters: dict[str, FamilyLimiter | None] = {
            family: FamilyLimiter(config.rpm, config.tpm) if limited else None
            for family in FAMILIES
        }

    def new_id(self) -> str:
        """Unique within the process run, cheap, and readable in logs."""
        return f"{self._id_prefix}{next(self._ids):08x}"

    def latency(self) -> float:
        config = self.config
        if config.latency_jitter_s > 0:
            return config.latency_s + self._latency_rng.random() * config.latency_jitter_s
        return config.latency_s

    async def hang(self) -> bool:
        """Sleep the injected hang; False when the server began stopping meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.config.faults.hang_s)
            return False
        return True

    def stop(self) -> None:
        self._stopping.set()

    def record(self, family: str, body: dict[str, Any], messages: list[dict[str, str]]) -> None:
        """Keep one live request: its body as sent, and the conversation the responder saw."""
        if self.recorded is not None:
            self.recorded.append({"family": family, "body": body, "messages": messages})

    def reset_stats(self) -> None:
        self.stats.reset()
        if self.recorded is not None:
            self.recorded.clear()
