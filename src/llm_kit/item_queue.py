"""Items for a long-lived live pool: put them as they come, close the queue when there are no
more. The pool's workers take from it directly, so an item costs what it costs from a plain
list; an async generator would go through a feeder task and a second, bounded buffer.

    queue = ItemQueue()
    pool = asyncio.create_task(llm.batch_to_callback(queue, on_result))
    queue.put(item)          # any time, from the event loop's thread
    queue.close()            # the pool ends once the queued items are done
    await pool

``hold()`` keeps the queued items (and those put later) from the workers until ``release()``:
they take no new item, and the requests they have under way come back (a process about to be
stopped lets what it paid for finish).
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
        # While held, the items wait here: the workers' ``pop`` stays as cheap as it is.
        self._held: collections.deque[BatchItem] | None = None

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called (queued items may still be waiting)."""
        return self._closed

    def put(self, item: BatchItem) -> None:
        """Queue ``item`` (waking one waiting consumer); a closed queue refuses it."""
        self.put_all((item,))

    @property
    def held(self) -> bool:
        """Whether ``hold`` keeps the queued items from the consumers now."""
        return self._held is not None

    @property
    def queued(self) -> int:
        """Items queued and not handed out yet (held ones included). Not ``len()``: a sink
        would take a queue that has one for a list, whose length is its total."""
        return len(self._items) + (len(self._held) if self._held is not None else 0)

    def put_all(self, items: Iterable[BatchItem]) -> None:
        """Queue ``items`` in order (waking as many waiting consumers)."""
        if self._closed:
            raise RuntimeError("put() on a closed ItemQueue")
        if self._held is not None:
            self._held.extend(items)
            return
        before = len(self._items)
        self._items.extend(items)
        self._wake(len(self._items) - before)

    def close(self) -> None:
        """No more items: consumers get the queued ones, then the end (held ones are never
        handed out)."""
        self._closed = True
        self._wake(len(self._waiters))

    def hold(self) -> None:
        """Hand out nothing more until ``release``: consumers wait as on an empty queue, and
        what is queued meanwhile waits with the rest."""
        if self._held is None:
            self._held, self._items = self._items, collections.deque()

    def release(self) -> None:
        """Hand the held items out again, in order (a closed queue hands out none)."""
        held, self._held = self._held, None
        if held and not self._closed:
            self.put_all(held)

    def drop(self, unwanted: Callable[[BatchItem], bool]) -> int:
        """Remove the queued items for which ``unwanted(item)`` is true (they are never
        sent); returns how many."""
        dropped = 0
        for queued in (self._items, self._held):
            if queued:
                kept = [item for item in queued if not unwanted(item)]
                dropped += len(queued) - len(kept)
                queued.clear()
                queued.extend(kept)
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
