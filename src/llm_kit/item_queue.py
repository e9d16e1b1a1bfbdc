"""Items for a long-lived live pool: put them as they come, close the queue when there are no
more. The pool's workers take from it directly, so an item costs what it costs from a plain
list; an async generator would go through a feeder task and a second, bounded buffer.

    queue = ItemQueue()
    pool = asyncio.create_task(llm.batch_to_callback(queue, on_result))
    queue.put(item)          # any time, from the event loop's thread
    queue.close()            # the pool ends once the queued items are done
    await pool
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_kit.types import BatchItem


class ItemQueue:
    """An unbounded FIFO of ``BatchItem`` that the live sinks accept as their ``items``."""

    def __init__(self) -> None:
        self._items: collections.deque[BatchItem] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called (queued items may still be waiting)."""
        return self._closed

    def put(self, item: BatchItem) -> None:
        """Queue ``item`` (waking one waiting consumer); a closed queue refuses it."""
        self.put_all((item,))

    def put_all(self, items: Iterable[BatchItem]) -> None:
        """Queue ``items`` in order (waking as many waiting consumers)."""
        if self._closed:
            raise RuntimeError("put() on a closed ItemQueue")
        before = len(self._items)
        self._items.extend(items)
        self._wake(len(self._items) - before)

    def close(self) -> None:
        """No more items: consumers get the queued ones, then the end."""
        self._closed = True
        self._wake(len(self._waiters))

    def drop(self, unwanted: Callable[[BatchItem], bool]) -> int:
        """Remove the queued items for which ``unwanted(item)`` is true (they are never
        sent); returns how many."""
        kept = [item for item in self._items if not unwanted(item)]
        dropped = len(self._items) - len(kept)
        self._items = collections.deque(kept)
        return dropped

    def pop(self) -> BatchItem | None:
        """The next queued item, or ``None`` when none is queued now (no waiting)."""
        return self._items.popleft() if self._items else None

    async def wait(self) -> bool:
        """Until an item is queued or the queue is closed: whether an item is there."""
        while not self._items:
            if self._closed:
                return False
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake(1)  # woken, then cancelled: the wake-up goes to another
                raise
        return True

    async def get(self) -> BatchItem | None:
        """The next item, waiting for one; ``None`` once the queue is closed and empty."""
        while (item := self.pop()) is None:
            if not await self.wait():
                return None
        return item

    def __aiter__(self) -> AsyncIterator[BatchItem]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[BatchItem]:
        while (item := await self.get()) is not None:
            yield item

    def _wake(self, count: int) -> None:
        # A waiter cancelled before its wake-up is still listed (done): skipped here.
        while count and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1


__all__ = ["ItemQueue"]
