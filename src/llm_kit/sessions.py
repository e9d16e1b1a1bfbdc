"""Who closes a client's connections: the call that opened them, when it ends.

A script that never closes its client (as the docs' examples do not) must still exit without
``Unclosed client session`` warnings, so each public call of ``LLM`` runs inside
``BackendScope.call``: the connection pool lives while any call is running (so requests within
a call, and concurrent calls, share it) and is closed when the last one ends. ``async with
LLM(...)`` or ``keep_open()`` hold it across calls until the block ends or ``aclose()``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from contextlib import aclosing, asynccontextmanager
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from llm_kit.backends import Backend

P = ParamSpec("P")
R = TypeVar("R")
Y = TypeVar("Y")


class BackendScope:
    """One backend per event loop, open while a call runs or while the client is held."""

    def __init__(self, factory: Callable[[], Backend]) -> None:
        self._factory = factory
        self._backend: Backend | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._calls = 0
        self._holds = 0

    def get(self) -> Backend:
        loop = asyncio.get_running_loop()
        if self._backend is None or self._loop is not loop:
            self._backend = self._factory()
            self._loop = loop
        return self._backend

    @asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        self._calls += 1
        try:
            yield
        finally:
            self._calls -= 1
            if self._calls == 0 and self._holds == 0:
                await self.close()

    def hold(self) -> None:
        self._holds += 1

    async def release(self) -> None:
        self._holds = max(0, self._holds - 1)
        if self._holds == 0 and self._calls == 0:
            await self.close()

    async def close(self) -> None:
        """Close now; later calls open (and close) their own connections again."""
        backend, self._backend, self._loop = self._backend, None, None
        self._holds = 0
        if backend is not None:
            await backend.aclose()


class Scoped(Protocol):
    _scope: BackendScope


S = TypeVar("S", bound=Scoped)


def closes_after(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, R]]:
    """A coroutine method that runs inside ``self._scope.call()``."""

    @functools.wraps(method)
    async def scoped(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        async with self._scope.call():
            return await method(self, *args, **kwargs)

    return scoped


def closes_after_stream(
    method: Callable[Concatenate[S, P], AsyncGenerator[Y, None]],
) -> Callable[Concatenate[S, P], AsyncGenerator[Y, None]]:
    """An async-generator method that runs inside ``self._scope.call()`` until it ends (also
    when the consumer stops early: the generator's cleanup then closes the scope)."""

    @functools.wraps(method)
    async def scoped(self: S, *args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[Y, None]:
        async with self._scope.call(), aclosing(method(self, *args, **kwargs)) as values:
            async for value in values:
                yield value

    return scoped


__all__ = ["BackendScope", "closes_after", "closes_after_stream"]
