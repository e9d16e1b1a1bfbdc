"""Ctrl-C during a live run that writes its results (``batch_to_jsonl``): the requests in
flight are paid for, so the first Ctrl-C is held while they come back and are written, and
reaches the program only then; a second one reaches it at once.

``GracefulStop`` is what the live pool obeys: once requested, its workers take no new item, the
items under way finish (for ``grace_s`` at most) and their results go out as usual, then the
pool ends as if it had run out of items. A pool obeys the stop that is current where it starts
(``POOL_STOP``): the sink that sets one governs only the pools it starts.

``HeldCtrlC`` holds the Ctrl-C: only where it would raise ``KeyboardInterrupt`` (Python's own
handler, or ``asyncio.run``'s, which cancels the main task), only in the main thread, and
nowhere a program installed a handler of its own (mmirage does: its shards drain themselves).
One call at a time holds it: a second one running meanwhile finds the first's handler, which is
not Python's own, and leaves it be (its pool stops when the held Ctrl-C reaches the program).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

Handler = Callable[[int, Any], Any]

# The stop the live pools started here obey (None: they run to their end).
POOL_STOP: ContextVar[GracefulStop | None] = ContextVar("llm_kit_pool_stop", default=None)


class GracefulStop:
    """A stop of the live pools that take it (``on_request``), asked for once with
    ``request()``, which is safe in a signal handler."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = max(0.0, grace_s)
        self.requested = False
        self._pools: list[tuple[asyncio.AbstractEventLoop, Callable[[], None]]] = []

    def on_request(self, stop_pool: Callable[[], None]) -> Callable[[], None]:
        """Call ``stop_pool()`` in this loop when the stop is requested (at once, if it was);
        returns what forgets it."""
        entry = (asyncio.get_running_loop(), stop_pool)
        if self.requested:
            stop_pool()
        else:
            self._pools.append(entry)
        return lambda: self._pools.remove(entry) if entry in self._pools else None

    def request(self) -> None:
        if self.requested:
            return
        self.requested = True
        pools, self._pools = self._pools, []
        for loop, stop_pool in pools:
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile has no pool
                loop.call_soon_threadsafe(stop_pool)


class HeldCtrlC:
    """``with held.holding():`` the first Ctrl-C stops ``held.stop`` instead of the program;
    ``await held.passed_on()`` afterwards hands it to the program (a second Ctrl-C meanwhile
    reached it at once)."""

    def __init__(self, grace_s: float) -> None:
        self.stop = GracefulStop(grace_s)
        self.held = False  # a Ctrl-C stopped the pools and has not reached the program yet
        self._program: Handler | None = None  # the program's own Ctrl-C handler

    @contextlib.contextmanager
    def holding(self) -> Iterator[GracefulStop]:
        token = POOL_STOP.set(self.stop)
        program = signal.getsignal(signal.SIGINT)
        main = threading.current_thread() is threading.main_thread()
        holds = main and callable(program) and _raises(program)
        if holds and callable(program):
            self._program = program
            signal.signal(signal.SIGINT, self._on_ctrl_c)
        try:
            yield self.stop
        finally:
            if holds and signal.getsignal(signal.SIGINT) == self._on_ctrl_c:
                signal.signal(signal.SIGINT, program)
            POOL_STOP.reset(token)

    def _on_ctrl_c(self, signum: int, frame: Any) -> None:
        if self.stop.requested:  # the second: the program's, now
            self.held = False
            assert self._program is not None
            self._program(signum, frame)
            return
        self.held = True
        self.stop.request()

    async def passed_on(self) -> None:
        """The held Ctrl-C reaches the program now, as if it came now: ``KeyboardInterrupt``
        here, or under ``asyncio.run`` the main task cancelled (then it raises at once when
        this is that task)."""
        if not self.held:
            return
        self.held = False
        assert self._program is not None
        self._program(signal.SIGINT, None)
        await asyncio.sleep(0)  # a cancel of this task lands here, as at any await
        raise KeyboardInterrupt


def _raises(handler: object) -> bool:
    """Whether ``handler`` is Python's own Ctrl-C: ``KeyboardInterrupt``, or ``asyncio.run``
    cancelling its main task (``asyncio.Runner``'s handler, a partial of its method)."""
    if handler is signal.default_int_handler:
        return True
    on_sigint = getattr(asyncio.Runner, "_on_sigint", None)
    return (
        on_sigint is not None
        and isinstance(handler, functools.partial)
        and getattr(handler.func, "__func__", None) is on_sigint
    )


__all__ = ["POOL_STOP", "GracefulStop", "HeldCtrlC"]
