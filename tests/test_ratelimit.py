from __future__ import annotations

import time
from typing import Any

from conftest import TEST_KEY
from llm_kit import LLM, BatchConfig, BatchItem, Message
from llm_kit.providers.base import RateLimitInfo
from llm_kit.ratelimit import RateLimiter
from provider_emulator import EmulatorConfig, running_emulator


async def test_idle_limiter_never_waits() -> None:
    limiter = RateLimiter()
    assert limiter.idle
    assert await limiter.acquire(10_000) == 0


async def test_requests_are_spaced_evenly() -> None:
    limiter = RateLimiter(rpm=1200)  # one every 50 ms
    started = time.monotonic()
    for _ in range(6):
        await limiter.acquire(1)
    # Five gaps of 50 ms at least: a burst would have taken ~0 s.
    assert time.monotonic() - started >= 0.25 - 0.01


async def test_token_budget_reserves_and_settles() -> None:
    limiter = RateLimiter(tpm=6000)  # 100 tokens a second, 6000 in a full bucket
    assert await limiter.acquire(5000) == 5000
    limiter.settle(5000, 1000)  # 4000 unused tokens given back: 5000 left
    await limiter.acquire(4950)  # fits: no debt
    assert limiter._tokens >= 0
    started = time.monotonic()
    await limiter.acquire(150)  # ~100 tokens short: about a second of refill
    assert time.monotonic() - started >= 0.8


async def test_cool_down_pauses_everyone() -> None:
    limiter = RateLimiter()
    limiter.cool_down(0.2)
    assert not limiter.idle
    started = time.monotonic()
    await limiter.acquire(1)
    assert time.monotonic() - started >= 0.19


def test_headers_tighten_the_budget() -> None:
    limiter = RateLimiter(rpm=10_000)
    limiter.observe(RateLimitInfo(limit_requests=600, limit_tokens=90_000, remaining_tokens=500))
    assert limiter.rpm == 600 and limiter.tpm == 90_000
    assert limiter._tokens <= 500
    limiter.observe(RateLimitInfo(limit_requests=1200))  # never loosened past the config
    assert limiter.rpm == 600


async def test_client_learns_the_limit_from_headers_and_avoids_429s() -> None:
    """The emulator enforces 300 RPM with real headers; the client was told nothing."""
    with running_emulator(EmulatorConfig(rpm=300)) as emu:
        llm = LLM(
            model="m",
            base_url=emu.openai_base_url,
            api_key=TEST_KEY,
            config=BatchConfig(worker_concurrency=4, max_retries=20),
        )
        items = [BatchItem(str(i), [Message.user("x")]) for i in range(30)]
        results = [r async for r in llm.batch_stream(items)]
        await llm.aclose()
        assert all(r.ok for r in results)
        assert llm.limiter.rpm == 300
        stats: dict[str, Any] = emu.stats()
    # The bucket starts full (300), so none of these 30 needed to be refused.
    assert stats["status"].get("429", 0) == 0
