"""How long to wait before a retry, and how many tokens to reserve before a request."""

from __future__ import annotations

import random
from typing import Any

from llm_kit.types import BatchConfig, BatchItem, ImagePart

_DEFAULT_OUTPUT_ESTIMATE = 256  # tokens reserved for the answer when max_tokens is unset
_IMAGE_TOKEN_ESTIMATE = 800


def backoff_delay(config: BatchConfig, attempt: int, server_wait: float | None) -> float:
    """The server's wait when it gave one, else exponential backoff with full jitter."""
    if server_wait is not None:
        return min(server_wait, config.retry_max_delay)
    ceiling = min(config.retry_max_delay, config.retry_base_delay * 2 ** (attempt - 1))
    return ceiling * (0.5 + random.random() / 2)


def estimate_tokens(item: BatchItem, sampling: dict[str, Any]) -> int:
    """A cheap upper-ish estimate for the TPM reservation: ~4 characters a token."""
    chars = images = 0
    for message in item.messages:
        for part in message.content:
            if isinstance(part, ImagePart):
                images += 1
            else:
                chars += len(part.text)
    output = sampling.get("max_tokens") or sampling.get("max_completion_tokens")
    return chars // 4 + 1 + images * _IMAGE_TOKEN_ESTIMATE + int(output or _DEFAULT_OUTPUT_ESTIMATE)
