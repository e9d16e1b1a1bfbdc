"""Provider blocks of a ``batch_api`` processor.

Plain stdlib dataclasses (no pydantic import here) so that a user's
``@dataclass class MistralBatchConfig(BatchProviderConfig)`` works exactly as the docs show;
the loader validates field types with pydantic and these ``__post_init__`` hooks check values,
so a subclass inherits the shared checks for free.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mmirage.config.errors import FieldError

OVERSIZED_REQUEST_POLICIES = ("isolate", "reject")


def _at_least(name: str, value: float | None, low: float, *, strict: bool = False) -> None:
    if value is None:
        return
    if (value <= low) if strict else (value < low):
        raise FieldError(name, f"must be {'>' if strict else '>='} {low:g}, got {value!r}")


def _within(name: str, value: float | None, low: float, high: float, *, open_low: bool) -> None:
    if value is None:
        return
    ok = (low < value <= high) if open_low else (low <= value <= high)
    if not ok or math.isnan(value):
        interval = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
        raise FieldError(name, f"must be in {interval}, got {value!r}")


def _non_empty(name: str, value: str) -> None:
    if not value.strip():
        raise FieldError(name, "must be a non-empty string")


@dataclass
class BatchProviderConfig:
    """Fields shared by every provider of the ``batch_api`` processor."""

    # Unknown keys are errors, also in user subclasses (pydantic reads this attribute).
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    provider: str
    max_chunk_bytes: int = 52_428_800
    max_requests_per_chunk: int | None = None
    metadata_output_path: str = ""
    oversized_request_policy: str = "isolate"
    # USD per million tokens at batch prices, {"input": x, "output": y}: for cost reports when
    # the model is missing from the built-in table (or its price changed).
    price_per_mtok: dict[str, float] | None = None

    def __post_init__(self) -> None:
        self.provider = self.provider.strip().lower()
        _non_empty("provider", self.provider)
        _at_least("max_chunk_bytes", self.max_chunk_bytes, 1)
        _at_least("max_requests_per_chunk", self.max_requests_per_chunk, 1)
        policy = self.oversized_request_policy.strip().lower()
        if policy not in OVERSIZED_REQUEST_POLICIES:
            raise FieldError(
                "oversized_request_policy",
                f"must be 'isolate' or 'reject', got {self.oversized_request_policy!r}",
            )
        self.oversized_request_policy = policy
        self.metadata_output_path = os.path.expanduser(self.metadata_output_path)
        if self.price_per_mtok is not None:
            if set(self.price_per_mtok) != {"input", "output"}:
                raise FieldError(
                    "price_per_mtok",
                    "must have exactly the keys 'input' and 'output' (USD per 1M tokens), got "
                    f"{sorted(self.price_per_mtok)}",
                )
            for key, value in self.price_per_mtok.items():
                _at_least(f"price_per_mtok.{key}", value, 0)


@dataclass
class OpenAIBatchConfig(BatchProviderConfig):
    """``provider: openai`` — the Files + Batches API (and compatible gateways via base_url)."""

    provider: str = "openai"
    model: str = "gpt-4.1-mini"
    batch_endpoint: str = "/v1/chat/completions"
    completion_window: str = "24h"
    base_url: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    # Sampling; unset fields leave the provider's defaults.
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _non_empty("model", self.model)
        if not self.batch_endpoint.startswith("/"):
            raise FieldError("batch_endpoint", f"must start with '/', got {self.batch_endpoint!r}")
        if self.completion_window != "24h":
            raise FieldError(
                "completion_window", f"only '24h' is supported, got {self.completion_window!r}"
            )
        _within("temperature", self.temperature, 0, 2, open_low=False)
        _within("top_p", self.top_p, 0, 1, open_low=True)
        _at_least("max_tokens", self.max_tokens, 1)
        _at_least("max_completion_tokens", self.max_completion_tokens, 1)
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise FieldError(
                "max_completion_tokens",
                "max_tokens and max_completion_tokens are two names for one limit; set only one",
            )


@dataclass
class AnthropicBatchConfig(BatchProviderConfig):
    """``provider: anthropic`` — Message Batches."""

    provider: str = "anthropic"
    model: str = "claude-haiku-4-5"
    max_tokens: int = 8192
    temperature: float | None = None
    top_p: float | None = None
    base_url: str | None = None
    timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _non_empty("model", self.model)
        _at_least("max_tokens", self.max_tokens, 1)
        _within("temperature", self.temperature, 0, 1, open_low=False)
        _within("top_p", self.top_p, 0, 1, open_low=True)
        _at_least("timeout_seconds", self.timeout_seconds, 0, strict=True)
        if self.temperature is not None and self.top_p is not None:
            raise FieldError(
                "top_p", "temperature and top_p are mutually exclusive for anthropic; set only one"
            )


@dataclass
class GeminiBatchConfig(BatchProviderConfig):
    """``provider: gemini`` — Gemini Batch Mode (``batchGenerateContent``)."""

    provider: str = "gemini"
    model: str = "gemini-2.5-flash"
    base_url: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_output_tokens: int | None = None
    seed: int | None = None
    timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _non_empty("model", self.model)
        _within("temperature", self.temperature, 0, 2, open_low=False)
        _within("top_p", self.top_p, 0, 1, open_low=True)
        _at_least("top_k", self.top_k, 1)
        _at_least("max_output_tokens", self.max_output_tokens, 1)
        _at_least("timeout_seconds", self.timeout_seconds, 0, strict=True)
