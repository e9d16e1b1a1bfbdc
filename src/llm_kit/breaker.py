"""Stop sending to an endpoint that does not answer: the live pool's circuit breaker.

With nothing listening at ``base_url`` every item would still make all its attempts and wait
all its backoffs (5 rows took 25 s; 300 rows were still going after 300 s). The breaker trips
when ``CONNECT_STREAK`` attempts in a row could not connect, or at least two did over
``CONNECT_WINDOW_S`` seconds (a pool too small to make the streak quickly); any answer, even an
HTTP error, ends a streak. Once tripped no request is sent: each item left, and each one
waiting for its retry, ends at once as a retryable ``not_sent`` failure (recorded like any
failure, so a rerun of the failed items sends them), and one warning names the URL.
"""

from __future__ import annotations

import asyncio
import logging
import time

from llm_kit.errors import ConnectError, ProviderError
from llm_kit.types import BatchItem, BatchResult

logger = logging.getLogger(__name__)

CONNECT_STREAK = 10  # attempts in a row that could not connect
CONNECT_WINDOW_S = 10.0  # ... or at least two of them, this long apart
NOT_SENT = "not_sent"  # the error kind of an item the breaker kept from being sent


class ConnectionBreaker:
    """One pool's breaker (``LLM`` resets it when a pool starts). Single event loop: no lock."""

    __slots__ = ("_sleepers", "failures", "first_failure_at", "not_sent_error", "tripped")

    def __init__(self) -> None:
        self._sleepers: set[asyncio.Future[None]] = set()
        self.reset()

    def reset(self) -> None:
        self.failures = 0
        self.first_failure_at = 0.0
        self.tripped = False
        self.not_sent_error = ""  # the recorded error of each item not sent, once tripped

    def answered(self) -> None:
        """The endpoint answered (anything, an error status too): the streak is over."""
        self.failures = 0

    def saw(self, error: ProviderError) -> None:
        """An attempt failed with ``error``: one that could not connect counts, an answer
        (an HTTP status) ends the streak, the others (a read timeout) tell nothing."""
        if isinstance(error, ConnectError):
            self.failed(error)
        elif error.status is not None:
            self.failures = 0

    def failed(self, error: ConnectError) -> bool:
        """An attempt could not connect; returns whether the breaker is (now) tripped."""
        now = time.monotonic()
        if not self.failures:
            self.first_failure_at = now
        self.failures += 1
        if not self.tripped and (
            self.failures >= CONNECT_STREAK
            or (self.failures >= 2 and now - self.first_failure_at >= CONNECT_WINDOW_S)
        ):
            self._trip(error)
        return self.tripped

    def _trip(self, error: ConnectError) -> None:
        self.tripped = True
        streak = f"{self.failures} connection attempts in a row failed"
        # Short: every row not sent carries it.
        self.not_sent_error = (
            f"not sent: nothing answers at {error.where} ({streak}); start the server or "
            "correct base_url, then retry"
        )
        logger.warning(
            "nothing answers at %s: %s (last: %s); no more requests are sent, the items left "
            "are recorded as not sent (retryable): start the server or correct base_url, then "
            "send them again",
            error.where,
            streak,
            error,
        )
        for sleeper in self._sleepers:
            if not sleeper.done():
                sleeper.set_result(None)

    def not_sent(self, item: BatchItem, attempts: int) -> BatchResult:
        """The result of an item the breaker keeps from being sent (again): a retryable
        failure."""
        return BatchResult(
            item.id,
            False,
            error=self.not_sent_error,
            error_kind=NOT_SENT,
            retryable=True,
            metadata=item.metadata,
            attempts=attempts,
        )

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep(seconds)``, cut short when the breaker trips (a backoff that would
        only end in another refused connection)."""
        if self.tripped:
            return
        loop = asyncio.get_running_loop()
        sleeper: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _wake, sleeper)
        self._sleepers.add(sleeper)
        try:
            await sleeper
        finally:
            timer.cancel()
            self._sleepers.discard(sleeper)


def _wake(sleeper: asyncio.Future[None]) -> None:
    if not sleeper.done():
        sleeper.set_result(None)


__all__ = ["CONNECT_STREAK", "NOT_SENT", "ConnectionBreaker"]
