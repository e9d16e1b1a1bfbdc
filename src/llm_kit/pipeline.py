"""The live pipeline's core loop: a fixed pool of workers, results handed over in batches.

There is no task per item and no list of pending items, so memory is
O(worker_concurrency + input_buffer_size) whatever the number of items. ``worker_concurrency``
workers take items straight from a plain iterable or an ``ItemQueue`` (an async iterable goes
through a feeder and a bounded buffer of ``input_buffer_size``: two tasks cannot share one
async generator), and the consumer takes every result that is ready at once: one wake-up, and
for the JSONL sink one write, per completion batch rather than per item.

A pool started where a ``GracefulStop`` is current (``interrupts.POOL_STOP``) obeys it: once it
is requested, no worker takes a new item, those under way finish (``grace_s`` at most) and their
results go out as usual, then the pool ends as if it had run out of items.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
)
from typing import Any

from llm_kit.interrupts import POOL_STOP
from llm_kit.item_queue import ItemQueue
from llm_kit.types import BatchItem, BatchResult

logger = logging.getLogger(__name__)

Items = Iterable[BatchItem] | AsyncIterable[BatchItem]
_END = object()  # the async feeder's last word to each worker


class _Outbox:
    """Results waiting for the consumer. Workers stop adding at ``limit`` until it takes them
    (a slow consumer holds the pool back instead of piling results up)."""

    __slots__ = ("_loop", "_room", "_wakeup", "error", "finished", "limit", "ready")

    def __init__(self, limit: int) -> None:
        self.ready: list[BatchResult] = []
        self.limit = limit
        self.finished = 0  # workers that have ended
        self.error: BaseException | None = None
        self._loop = asyncio.get_running_loop()
        self._wakeup: asyncio.Future[None] | None = None
        self._room: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter = self._wakeup
        if waiter is not None:
            self._wakeup = None
            if not waiter.done():
                waiter.set_result(None)

    async def put(self, result: BatchResult) -> None:
        self.ready.append(result)
        self.wake()
        while len(self.ready) >= self.limit:
            if self._room is None:
                self._room = self._loop.create_future()
            await self._room

    def fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.wake()

    async def take(self, workers: int) -> list[BatchResult]:
        """Every result ready now (waiting for one); [] when all workers have ended."""
        while not self.ready:
            if self.error is not None:
                raise self.error
            if self.finished >= workers:
                return []
            self._wakeup = self._loop.create_future()
            await self._wakeup
        batch, self.ready = self.ready, []
        room, self._room = self._room, None
        if room is not None and not room.done():
            room.set_result(None)
        return batch


async def run_pool(
    items: Items,
    process: Callable[[BatchItem], Awaitable[BatchResult]],
    *,
    workers: int,
    buffer_size: int,
    skip: Callable[[BatchItem], bool] | None = None,
) -> AsyncGenerator[list[BatchResult], None]:
    """Yield ``process(item)`` for every item (not skipped), in batches of the results that
    completed together, in completion order."""
    outbox = _Outbox(limit=workers)
    tasks: list[asyncio.Task[None]] = []
    stop = _Stopping(tasks)

    async def work(source: Iterator[BatchItem] | asyncio.Queue[Any] | ItemQueue) -> None:
        busy = stop.busy  # the workers with an item under way: a stop lets them finish it
        me = asyncio.current_task()
        try:
            if isinstance(source, ItemQueue):
                # An item at once when one is queued (no coroutine per item); else wait for
                # one, then take it on the next pass (False: closed and empty).
                while not stop.stopped and (
                    (item := source.pop()) is not None or await source.wait()
                ):
                    if item is not None and (skip is None or not skip(item)):
                        busy.add(me)
                        await outbox.put(await process(item))
                        busy.discard(me)
            elif isinstance(source, asyncio.Queue):
                while not stop.stopped and (fed := await source.get()) is not _END:
                    busy.add(me)
                    await outbox.put(await process(fed))
                    busy.discard(me)
            else:
                for item in source:  # shared by all workers: each next() hands out one item
                    if stop.stopped:
                        break
                    if skip is None or not skip(item):
                        busy.add(me)
                        await outbox.put(await process(item))
                        busy.discard(me)
        except Exception as exc:  # the source's own error, or a fatal one (a rejected API key)
            outbox.fail(exc)
        finally:
            outbox.finished += 1
            outbox.wake()

    async def feed(source: AsyncIterable[BatchItem], inbox: asyncio.Queue[Any]) -> None:
        try:
            async for item in source:
                if skip is None or not skip(item):
                    await inbox.put(item)
        except Exception as exc:  # the source's own error: report it, do not swallow it
            outbox.fail(exc)
        for _ in range(workers):
            await inbox.put(_END)

    source: Iterator[BatchItem] | asyncio.Queue[Any] | ItemQueue
    if isinstance(items, ItemQueue):
        source = items  # the workers take from it directly
    elif isinstance(items, AsyncIterable):
        source = asyncio.Queue(maxsize=buffer_size)
        tasks.append(asyncio.create_task(feed(items, source)))
    else:
        source = iter(items)
    tasks += [asyncio.create_task(work(source)) for _ in range(workers)]
    graceful = POOL_STOP.get()
    forget = graceful.on_request(lambda: stop(graceful.grace_s)) if graceful else None
    try:
        while batch := await outbox.take(workers):
            yield batch
    finally:
        if forget is not None:
            forget()
        stop.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Stopping:
    """A pool's graceful stop: when called, its workers take no new item; the idle ones (and
    the feeder) end now, the busy ones after their item, or at ``grace_s`` at the latest."""

    __slots__ = ("busy", "stopped", "tasks", "timer")

    def __init__(self, tasks: list[asyncio.Task[None]]) -> None:
        self.tasks = tasks
        self.busy: set[asyncio.Task[Any] | None] = set()
        self.stopped = False
        self.timer: asyncio.TimerHandle | None = None

    def __call__(self, grace_s: float) -> None:
        if self.stopped:
            return
        self.stopped = True
        # Said at once: the program may take that long to end, and the user should know why.
        logger.warning(
            "stopping: no new request; waiting up to %g s for the %d in flight (a second "
            "Ctrl-C stops at once)",
            grace_s,
            len(self.busy),
        )
        for task in self.tasks:
            if task not in self.busy:
                task.cancel()  # waiting for an item, which it would not take
        self.timer = asyncio.get_running_loop().call_later(grace_s, self._abandon)

    def _abandon(self) -> None:
        for task in self.tasks:
            task.cancel()

    def close(self) -> None:
        """The pool ended: no deadline left to keep."""
        if self.timer is not None:
            self.timer.cancel()
