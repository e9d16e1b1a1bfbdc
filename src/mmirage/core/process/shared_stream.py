"""One llm_kit request pool for every group of rows an ``llm`` processor is handed.

The shard runner keeps two groups in flight, so that request slots never idle while the next
group is read and rendered. Were each group its own ``batch_stream``, the two pools would
hold twice ``worker_concurrency`` requests over one connection pool of that size: half of them
would wait for a connection, and every group would start and stop a pool of its own. Here the
groups' items go into one queue that one long-lived ``batch_to_callback`` drains, and each
result is routed back to the group that sent it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_kit import LLM, BatchItem, BatchResult

GROUP = "__group__"  # the item metadata key that says which group an item belongs to


class _Group:
    """The results of one group that its consumer has not taken yet."""

    __slots__ = ("ready", "wakeup")

    def __init__(self) -> None:
        self.ready: list[BatchResult] = []
        self.wakeup: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self.wakeup is not None and not self.wakeup.done():
            self.wakeup.set_result(None)


class SharedStream:
    """``results(items)`` for any number of concurrent callers, over one pool of ``llm``'s
    ``worker_concurrency`` requests. The pool starts with the first call on a loop and ends
    at ``stop()``; a fatal error of the pool (a rejected API key) is raised to every caller."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self._queue: asyncio.Queue[BatchItem | None] | None = None
        self._pump: asyncio.Task[int] | None = None
        self._groups: dict[int, _Group] = {}
        self._ids = itertools.count()

    async def results(self, items: Sequence[BatchItem]) -> AsyncIterator[list[BatchResult]]:
        """The items' results, in the batches they arrive in (items carry
        ``metadata[GROUP]`` afterwards)."""
        queue = self._running_queue()
        group_id, group = next(self._ids), _Group()
        self._groups[group_id] = group
        try:
            for item in items:
                item.metadata[GROUP] = group_id
                queue.put_nowait(item)
            remaining = len(items)
            while remaining:
                if not group.ready:
                    await self._wait(group)
                batch, group.ready = group.ready, []
                remaining -= len(batch)
                yield batch
        finally:
            # A caller that stops early leaves its other results nobody to go to.
            del self._groups[group_id]

    async def stop(self) -> None:
        """End the pool once the queued items are done (then the next call starts a new one);
        raise its fatal error, if it had one."""
        pump, queue = self._pump, self._queue
        self._pump = self._queue = None
        if pump is None or queue is None:
            return
        if not pump.done():
            queue.put_nowait(None)
        await pump

    async def cancel(self) -> None:
        """End the pool now, its requests in flight abandoned."""
        pump = self._pump
        self._pump = self._queue = None
        if pump is not None and not pump.done():
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)

    def _running_queue(self) -> asyncio.Queue[BatchItem | None]:
        pump, loop = self._pump, asyncio.get_running_loop()
        if self._queue is None or pump is None or pump.get_loop() is not loop or pump.done():
            if pump is not None and pump.done() and not pump.cancelled() and pump.exception():
                raise pump.exception()  # type: ignore[misc]
            self._queue = asyncio.Queue()
            self._pump = loop.create_task(self.llm.batch_to_callback(self._items(), self._route))
            self._pump.add_done_callback(self._wake_all)
        return self._queue

    async def _items(self) -> AsyncIterator[BatchItem]:
        queue = self._queue
        assert queue is not None
        while (item := await queue.get()) is not None:
            yield item

    def _route(self, result: BatchResult) -> None:
        group = self._groups.get(result.metadata[GROUP])
        if group is not None:
            group.ready.append(result)
            group.wake()

    def _wake_all(self, _: Any) -> None:
        for group in self._groups.values():
            group.wake()

    async def _wait(self, group: _Group) -> None:
        pump = self._pump
        if pump is None or pump.done():
            # The pool ended (its error, or stop() before this group was done).
            if pump is not None and not pump.cancelled() and pump.exception() is not None:
                raise pump.exception()  # type: ignore[misc]
            raise RuntimeError("the request pool ended before every result came back")
        group.wakeup = asyncio.get_running_loop().create_future()
        try:
            await group.wakeup
        finally:
            group.wakeup = None
        if not group.ready and pump.done():
            await self._wait(group)  # raises the pool's error


__all__ = ["GROUP", "SharedStream"]
