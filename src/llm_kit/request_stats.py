"""What a client's requests came to so far: retries by cause, time the pool spent cooling
down after rate limits, tokens used. Counted on the hot path (plain integers, one event loop:
no lock) and read by whoever reports progress (``LLM.request_stats()``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from llm_kit.errors import ProviderError

logger = logging.getLogger("llm_kit.retries")

RATE_LIMITED = "429"
# Why a request was sent again, in the order reports list them.
RETRY_CAUSES = (RATE_LIMITED, "5xx", "timeout", "connection", "other")
# ProviderError kinds of requests that got no answer (``transport``).
_UNANSWERED = {"timeout": "timeout", "connection_error": "connection"}


def retry_cause(exc: ProviderError) -> str:
    """The cause a retry is counted under: ``429``, ``5xx``, ``timeout``, ``connection`` or
    ``other`` (a broken answer, another retryable status)."""
    if exc.status == 429:
        return RATE_LIMITED
    if exc.status is not None and exc.status >= 500:
        return "5xx"
    return _UNANSWERED.get(exc.kind, "other")


@dataclass
class RequestStats:
    """One client's counters; ``cooldown_seconds`` is filled in from its rate limiter when
    read (``LLM.request_stats()``)."""

    model: str = ""
    retries: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RETRY_CAUSES, 0))
    cooldown_seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def retried(self) -> int:
        return sum(self.retries.values())

    @property
    def rate_limited(self) -> int:
        return self.retries[RATE_LIMITED]

    def retry(self, exc: ProviderError, item_id: str, attempt: int, delay: float) -> None:
        """A request that failed with ``exc`` is sent again after ``delay`` seconds."""
        cause = retry_cause(exc)
        self.retries[cause] += 1
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "retry of %s in %.2f s: attempt %d failed (%s): %s",
                item_id,
                delay,
                attempt,
                cause,
                exc,
            )

    def used(self, input_tokens: int, output_tokens: int) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
