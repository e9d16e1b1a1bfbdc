"""What every live sink does with the pool's batches: record, count, fail fast, quiet the gc."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from llm_kit.errors import BatchItemFailed
from llm_kit.gcquiet import quiet_gc
from llm_kit.progress import ProgressBar
from llm_kit.types import BatchResult


async def delivered(
    batches: AsyncGenerator[list[BatchResult], None],
    *,
    total: int | None,
    progress: bool,
    record: Callable[[list[BatchResult]], None] | None,
    fail_fast: bool,
) -> AsyncGenerator[list[BatchResult], None]:
    """``batches`` passed on, each one recorded first (all of it: every result in it is paid
    for); with ``fail_fast`` the first failed result raises BatchItemFailed, and only the
    results before it are passed on."""
    # aclosing: stopping early (or fail-fast) stops the workers before the pool closes.
    async with aclosing(batches):
        with ProgressBar(total, enabled=progress) as bar, quiet_gc():
            async for batch in batches:
                if record is not None:
                    record(batch)
                failed = sum(not result.ok for result in batch)
                bar.add(len(batch), failed)
                if failed and fail_fast:
                    first = next(i for i, result in enumerate(batch) if not result.ok)
                    if first:
                        yield batch[:first]
                    error = batch[first].error or "unknown error"
                    raise BatchItemFailed(batch[first].id, error)
                yield batch


__all__ = ["delivered"]
