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
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_kit import LLM, BatchItem, BatchResult

GROUP = "__group__"  # the item metadata key that says which group an item belongs to


class _Group:
    """The results of one group that its consumer has not taken yet, and the pool that
    computes them."""

    __slots__ = ("pump", "ready", "wakeup")

    def __init__(self, pump: asyncio.Task[int]) -> None:
        self.pump = pump
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
        # The running pool: its queue and the task that drains it (None between pools).
        self._pool: tuple[asyncio.Queue[BatchItem | None], asyncio.Task[int]] | None = None
        self._groups: dict[int, _Group] = {}
        self._ids = itertools.count()

    async def results(self, items: Sequence[BatchItem]) -> AsyncGenerator[list[BatchResult], None]:
        """The items' results, in the batches they arrive in (items carry
        ``metadata[GROUP]`` afterwards). A caller that stops early closes the generator
        (``aclosing``): its queued items are dropped, and the pool stops if no other caller
        waits."""
        queue, pump = self._running()
        group_id, group = next(self._ids), _Group(pump)
        self._groups[group_id] = group
        remaining = len(items)
        try:
            for item in items:
                item.metadata[GROUP] = group_id
                queue.put_nowait(item)
            while remaining:
                await self._wait(group)
                batch, group.ready = group.ready, []
                remaining -= len(batch)
                yield batch
        finally:
            del self._groups[group_id]
            if remaining and not self._groups and self._pump is pump and not pump.done():
                # The last caller stopped early (a run that is failing): what it has not sent
                # yet must not be paid for, so the pool stops (the next call starts another).
                # With other callers still waiting, only its queued items are dropped.
                self._abandon()

    async def stop(self) -> None:
        """End the pool once the queued items are done (then the next call starts a new one);
        raise its fatal error, if it had one."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        queue, pump = pool
        if not pump.done():
            queue.put_nowait(None)
        await pump

    async def cancel(self) -> None:
        """End the pool now, its requests in flight abandoned."""
        pump = self._abandon()
        if pump is not None:
            await asyncio.gather(pump, return_exceptions=True)

    @property
    def _pump(self) -> asyncio.Task[int] | None:
        return None if self._pool is None else self._pool[1]

    def _abandon(self) -> asyncio.Task[int] | None:
        pump = self._pump
        self._pool = None
        if pump is not None and not pump.done():
            pump.cancel()
        return pump

    def _running(self) -> tuple[asyncio.Queue[BatchItem | None], asyncio.Task[int]]:
        """This loop's queue and pool, started if there are none (or only a finished one)."""
        pump, loop = self._pump, asyncio.get_running_loop()
        if self._pool is not None and pump is not None and pump.get_loop() is loop:
            if not pump.done():
                return self._pool
            if not pump.cancelled() and pump.exception():
                raise pump.exception()  # type: ignore[misc]
        queue: asyncio.Queue[BatchItem | None] = asyncio.Queue()
        pump = loop.create_task(
            self.llm.batch_to_callback(_live_items(queue, self._groups), self._route)
        )
        pump.add_done_callback(self._wake_all)
        self._pool = (queue, pump)
        return self._pool

    def _route(self, result: BatchResult) -> None:
        group = self._groups.get(result.metadata[GROUP])
        if group is not None:
            group.ready.append(result)
            group.wake()

    def _wake_all(self, _: Any) -> None:
        for group in self._groups.values():
            group.wake()

    async def _wait(self, group: _Group) -> None:
        """Until the group has results; raises when its pool ended first (with the pool's
        error, a rejected key, if it had one)."""
        while not group.ready:
            pump = group.pump
            if pump.done():
                if not pump.cancelled() and pump.exception() is not None:
                    raise pump.exception()  # type: ignore[misc]
                raise RuntimeError("the request pool ended before every result came back")
            group.wakeup = asyncio.get_running_loop().create_future()
            try:
                await group.wakeup
            finally:
                group.wakeup = None


async def _live_items(
    queue: asyncio.Queue[BatchItem | None], groups: dict[int, _Group]
) -> AsyncIterator[BatchItem]:
    """The queued items whose group still waits for them."""
    while (item := await queue.get()) is not None:
        if item.metadata[GROUP] in groups:
            yield item


__all__ = ["GROUP", "SharedStream"]
