"""One llm_kit request pool for every group of rows an ``llm`` processor is handed.

The shard runner keeps two groups in flight, so that request slots never idle while the next
group is read and rendered. Were each group its own ``batch_stream``, the two pools would
hold twice ``worker_concurrency`` requests over one connection pool of that size: half of them
would wait for a connection, and every group would start and stop a pool of its own. Here the
groups' items go into one queue that one long-lived ``batch_to_callback`` drains, and each
result is handed to the callback of the group that sent it.

``drain()`` holds the queue: no new request starts, and it returns once every one under way has
come back (a stopped shard keeps what it paid for), with how many did.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # llm_kit is imported when a processor is built, not before
    from llm_kit import LLM, BatchItem, BatchResult, ItemQueue

GROUP = "__group__"  # the item metadata key that says which group an item belongs to


class _Group:
    """One caller's items in the pool: where their results go, how many are still out, and
    the future its caller waits on (set once every result was taken, or with the error that
    ended the group)."""

    __slots__ = ("done", "pump", "remaining", "take")

    def __init__(
        self,
        pump: asyncio.Task[int],
        take: Callable[[BatchResult], None],
        remaining: int,
        done: asyncio.Future[None],
    ) -> None:
        self.pump, self.take, self.remaining, self.done = pump, take, remaining, done

    def fail(self, error: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(error)


class SharedStream:
    """``run(items, take)`` for any number of concurrent callers, over one pool of ``llm``'s
    ``worker_concurrency`` requests. The pool starts with the first call on a loop and ends
    at ``stop()``; a fatal error of the pool (a rejected API key) is raised to every caller."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        # The running pool: its queue and the task that drains it (None between pools).
        self._pool: tuple[ItemQueue, asyncio.Task[int]] | None = None
        self._groups: dict[int, _Group] = {}
        self._ids = itertools.count()
        # Items of the running pool not answered yet (queued or in flight), answers routed so
        # far, and who waits for the ones in flight to come back (``drain``).
        self._unanswered = 0
        self._answered = 0
        self._drained: asyncio.Future[None] | None = None

    async def run(self, items: Sequence[BatchItem], take: Callable[[BatchResult], None]) -> None:
        """Hand each item's result to ``take`` as it arrives (items carry ``metadata[GROUP]``
        afterwards) and return once every one was taken. Results come to ``take`` straight
        from the pool's callback: the caller's task wakes once, at the end, not once per
        answer. An exception from ``take``, or the caller being cancelled, ends the call: its
        queued items are dropped, and the pool stops if no other caller waits."""
        if not items:
            return
        queue, pump = self._running()
        group_id = next(self._ids)
        group = _Group(pump, take, len(items), asyncio.get_running_loop().create_future())
        self._groups[group_id] = group
        try:
            for item in items:
                item.metadata[GROUP] = group_id
            queue.put_all(items)
            self._unanswered += len(items)
            await group.done
        finally:
            del self._groups[group_id]
            if group.remaining and not self._groups and self._pump is pump and not pump.done():
                # The last caller stopped early (a run that is failing): what it has not sent
                # yet must not be paid for, so the pool stops (the next call starts another).
                self._abandon()
            elif group.remaining:  # other callers still wait: only this one's items go
                dropped = queue.drop(lambda item: item.metadata[GROUP] == group_id)
                if self._pool is not None and self._pool[0] is queue:  # counted in this pool
                    self._unanswered -= dropped
                    self._check_drained()

    async def stop(self) -> None:
        """End the pool once the queued items are done (then the next call starts a new one);
        raise its fatal error, if it had one."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        queue, pump = pool
        queue.close()
        await pump

    async def drain(self) -> int:
        """Start no new request (the queued items are held) and return once every one under
        way has its result, handed to its group as usual: how many came back meanwhile."""
        pool = self._pool
        if pool is None:
            return 0
        queue, pump = pool
        queue.hold()
        if not self._in_flight() or pump.done():
            return 0
        answered = self._answered
        drained = self._drained
        if drained is None or drained.done():
            drained = self._drained = asyncio.get_running_loop().create_future()
            pump.add_done_callback(lambda _: _resolve(drained))  # a dead pool has none in flight
        await asyncio.shield(drained)  # a caller that gives up leaves it to the others
        return self._answered - answered  # held: each was under way when the drain began

    async def cancel(self) -> None:
        """End the pool now, its requests in flight abandoned."""
        pump = self._abandon()
        if pump is not None:
            await asyncio.gather(pump, return_exceptions=True)

    @property
    def _pump(self) -> asyncio.Task[int] | None:
        return None if self._pool is None else self._pool[1]

    def _in_flight(self) -> int:
        return self._unanswered - self._pool[0].queued if self._pool is not None else 0

    def _check_drained(self) -> None:
        if self._drained is not None and not self._in_flight():
            _resolve(self._drained)

    def _abandon(self) -> asyncio.Task[int] | None:
        pump = self._pump
        self._pool = None  # and so nothing is in flight
        self._check_drained()
        if pump is not None and not pump.done():
            pump.cancel()
        return pump

    def _running(self) -> tuple[ItemQueue, asyncio.Task[int]]:
        """This loop's queue and pool, started if there are none (or only a finished one)."""
        pump, loop = self._pump, asyncio.get_running_loop()
        if self._pool is not None and pump is not None and pump.get_loop() is loop:
            if not pump.done():
                return self._pool
            if not pump.cancelled() and pump.exception():
                raise pump.exception()  # type: ignore[misc]
        from llm_kit import ItemQueue

        queue = ItemQueue()
        self._unanswered = 0
        pump = loop.create_task(self.llm.batch_to_callback(queue, self._route))
        pump.add_done_callback(self._end_all)
        self._pool = (queue, pump)
        return self._pool

    def _route(self, result: BatchResult) -> None:
        self._unanswered -= 1
        self._answered += 1
        if self._drained is not None:
            self._check_drained()
        group = self._groups.get(result.metadata[GROUP])
        if group is None or group.done.done():
            return
        try:
            group.take(result)
        except Exception as exc:  # the caller's own failure (a journal write): its group ends
            group.fail(exc)
            return
        group.remaining -= 1
        if not group.remaining:
            group.done.set_result(None)

    def _end_all(self, pump: asyncio.Task[int]) -> None:
        """The pool ended: every group still waiting on it fails (with the pool's error, a
        rejected key, if it had one); a group of a later pool keeps waiting."""
        error = None if pump.cancelled() else pump.exception()
        for group in [g for g in self._groups.values() if g.pump is pump]:
            group.fail(
                error or RuntimeError("the request pool ended before every result came back")
            )


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


__all__ = ["GROUP", "SharedStream"]
