"""The live pipeline's core loop: a fixed pool of workers over a bounded input buffer.

There is no task per item and no list of pending items, so memory is
O(worker_concurrency + input_buffer_size) whatever the number of items: a feeder reads the
source into a bounded queue, ``worker_concurrency`` workers take from it, and results leave
through a small bounded queue in completion order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Iterable
from typing import Any

from llm_kit.types import BatchItem, BatchResult

Items = Iterable[BatchItem] | AsyncIterable[BatchItem]
_DONE = object()  # a worker has finished


class _Failed:
    """The item source or a worker raised: the consumer re-raises the exception."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


async def run_pool(
    items: Items,
    process: Callable[[BatchItem], Awaitable[BatchResult]],
    *,
    workers: int,
    buffer_size: int,
    skip: Callable[[BatchItem], bool] | None = None,
) -> AsyncGenerator[BatchResult, None]:
    """Yield ``process(item)`` for every item (not skipped), as the results complete."""
    inbox: asyncio.Queue[Any] = asyncio.Queue(maxsize=buffer_size)
    outbox: asyncio.Queue[Any] = asyncio.Queue(maxsize=workers)

    async def feed() -> None:
        try:
            if isinstance(items, AsyncIterable):
                async for item in items:
                    if skip is None or not skip(item):
                        await inbox.put(item)
            else:
                for item in items:
                    if skip is None or not skip(item):
                        await inbox.put(item)
        except Exception as exc:  # the source's own error: report it, do not swallow it
            await outbox.put(_Failed(exc))
        for _ in range(workers):
            await inbox.put(_DONE)

    async def work() -> None:
        while True:
            item = await inbox.get()
            if item is _DONE:
                await outbox.put(_DONE)
                return
            try:
                result = await process(item)
            except Exception as exc:  # fatal for the whole run (e.g. a rejected API key)
                await outbox.put(_Failed(exc))
                return
            await outbox.put(result)

    tasks = [asyncio.create_task(feed())]
    tasks += [asyncio.create_task(work()) for _ in range(workers)]
    finished = 0
    try:
        while finished < workers:
            out = await outbox.get()
            if out is _DONE:
                finished += 1
            elif isinstance(out, _Failed):
                raise out.error
            else:
                yield out
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
