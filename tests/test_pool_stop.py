"""The live pool's graceful stop (``llm_kit.interrupts.GracefulStop``), in-process: once it is
requested no worker takes a new item, the items under way finish and their results go out, and
the pool ends, whatever feeds it (a list, an async generator, an ``ItemQueue`` left open); an
item that outlasts ``grace_s`` is abandoned."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from llm_kit import BatchItem, BatchResult, ItemQueue, Message
from llm_kit.interrupts import POOL_STOP, GracefulStop
from llm_kit.pipeline import run_pool

WORKERS = 4


def items(n: int) -> list[BatchItem]:
    return [BatchItem(f"item-{i}", [Message.user(f"say {i}")]) for i in range(n)]


async def generated(n: int) -> AsyncIterator[BatchItem]:
    for item in items(n):
        yield item


def queued(n: int) -> ItemQueue:
    queue = ItemQueue()
    queue.put_all(items(n))  # never closed: only the stop ends the pool
    return queue


SOURCES: dict[str, Callable[[int], Any]] = {"list": items, "async": generated, "queue": queued}


async def stopped_pool(
    source: Any, grace_s: float, answers: bool = True
) -> tuple[set[str], set[str]]:
    """Start the pool, stop it once every worker has an item, then let the answers come (or
    never): the items started, and those whose results came out."""
    started: set[str] = set()
    answer = asyncio.Event()

    async def process(item: BatchItem) -> BatchResult:
        started.add(item.id)
        await answer.wait()
        return BatchResult(item.id, True, "ok")

    stop = GracefulStop(grace_s)
    token = POOL_STOP.set(stop)
    delivered: set[str] = set()
    try:
        pool = run_pool(source, process, workers=WORKERS, buffer_size=8)

        async def consume() -> None:
            async for batch in pool:
                delivered.update(result.id for result in batch)

        consumer = asyncio.create_task(consume())
        while len(started) < WORKERS:
            await asyncio.sleep(0.01)
        stop.request()
        for _ in range(3):  # the stop reaches the pool before any answer does
            await asyncio.sleep(0)
        if answers:
            answer.set()
        await asyncio.wait_for(consumer, 30)
    finally:
        POOL_STOP.reset(token)
    return started, delivered


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_stopped_pool_finishes_what_it_started_and_takes_nothing_new(kind: str) -> None:
    started, delivered = asyncio.run(stopped_pool(SOURCES[kind](100), 30))
    assert len(started) == WORKERS
    assert delivered == started  # every result paid for went out


def test_an_answer_that_outlasts_the_grace_is_abandoned() -> None:
    started, delivered = asyncio.run(stopped_pool(items(100), 0.05, answers=False))
    assert len(started) == WORKERS and delivered == set()


def test_a_pool_started_elsewhere_ignores_the_stop() -> None:
    async def main() -> int:
        stop = GracefulStop(30)
        stop.request()  # requested before: only pools started under it would obey

        async def process(item: BatchItem) -> BatchResult:
            return BatchResult(item.id, True, "ok")

        return sum([len(b) async for b in run_pool(items(50), process, workers=4, buffer_size=8)])

    assert asyncio.run(main()) == 50
