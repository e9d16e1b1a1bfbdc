"""``llm_kit.ItemQueue``: items put while a live pool runs, taken by its workers directly."""

from __future__ import annotations

import asyncio

import pytest

from llm_kit import BatchItem, ItemQueue, Message


def item(name: str) -> BatchItem:
    return BatchItem(name, [Message.user(name)])


def test_items_come_out_in_order_then_the_end_once_closed() -> None:
    async def main() -> list[str | None]:
        queue = ItemQueue()
        for name in ("a", "b"):
            queue.put(item(name))
        queue.close()
        got = [await queue.get(), await queue.get(), await queue.get(), await queue.get()]
        return [None if i is None else i.id for i in got]

    assert asyncio.run(main()) == ["a", "b", None, None]


def test_waiting_consumers_wake_for_each_item_and_all_wake_at_close() -> None:
    async def main() -> list[str | None]:
        queue = ItemQueue()
        consumers = [asyncio.create_task(queue.get()) for _ in range(3)]
        await asyncio.sleep(0)
        queue.put(item("a"))
        await asyncio.sleep(0)
        queue.close()
        got = await asyncio.gather(*consumers)
        return sorted((i.id if i else "end") for i in got)

    assert asyncio.run(main()) == ["a", "end", "end"]


def test_a_consumer_cancelled_after_its_wakeup_passes_the_item_on() -> None:
    async def main() -> str | None:
        queue = ItemQueue()
        first = asyncio.create_task(queue.get())
        second = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        queue.put(item("a"))  # wakes `first`...
        first.cancel()  # ...which is cancelled before it runs
        got = await asyncio.wait_for(second, timeout=1)
        return None if got is None else got.id

    assert asyncio.run(main()) == "a"


def test_drop_removes_queued_items_and_put_after_close_fails() -> None:
    async def main() -> list[str]:
        queue = ItemQueue()
        for name in ("a1", "b1", "a2"):
            queue.put(item(name))
        assert queue.drop(lambda i: i.id.startswith("a")) == 2
        queue.close()
        with pytest.raises(RuntimeError, match="closed"):
            queue.put(item("c"))
        return [i.id async for i in queue]

    assert asyncio.run(main()) == ["b1"]


def test_put_all_wakes_one_consumer_per_item_and_pop_never_waits() -> None:
    async def main() -> tuple[list[str], bool]:
        queue = ItemQueue()
        assert queue.pop() is None
        consumers = [asyncio.create_task(queue.get()) for _ in range(3)]
        await asyncio.sleep(0)
        queue.put_all([item("a"), item("b")])
        got = await asyncio.wait_for(asyncio.gather(*consumers[:2]), timeout=1)
        assert not consumers[2].done()  # two items woke two consumers
        queue.close()
        assert await consumers[2] is None
        return sorted(i.id for i in got if i is not None), await queue.wait()

    assert asyncio.run(main()) == (["a", "b"], False)


def test_a_held_queue_hands_out_nothing_until_released_then_all_in_order() -> None:
    async def main() -> list[str]:
        queue = ItemQueue()
        queue.put_all([item("a"), item("b")])
        queue.hold()
        assert queue.held and queue.pop() is None and queue.queued == 2
        queue.put(item("c"))  # put while held: waits with the rest
        waiting = asyncio.create_task(queue.get())
        await asyncio.sleep(0.02)
        assert not waiting.done()
        assert queue.drop(lambda i: i.id == "b") == 1 and queue.queued == 2
        queue.release()
        first = await asyncio.wait_for(waiting, timeout=1)
        assert first is not None and not queue.held
        queue.close()
        return [first.id, *[i.id async for i in queue]]

    assert asyncio.run(main()) == ["a", "c"]


def test_closing_a_held_queue_ends_its_consumers_without_its_items() -> None:
    async def main() -> list[str]:
        queue = ItemQueue()
        queue.put(item("a"))
        queue.hold()
        waiting = asyncio.create_task(queue.get())
        await asyncio.sleep(0.02)
        queue.close()
        assert await asyncio.wait_for(waiting, timeout=1) is None
        queue.release()  # closed: still nothing handed out
        return [i.id async for i in queue]

    assert asyncio.run(main()) == []
