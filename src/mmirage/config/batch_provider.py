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


def check_price_per_mtok(price: dict[str, float] | None) -> None:
    """``price_per_mtok`` (of a ``batch_api`` or an ``llm`` processor): ``{input, output}``."""
    if price is None:
        return
    if set(price) != {"input", "output"}:
        raise FieldError(
            "price_per_mtok",
            "must have exactly the keys 'input' and 'output' (USD per 1M tokens), got "
            f"{sorted(price)}",
        )
    for key, value in price.items():
        _at_least(f"price_per_mtok.{key}", value, 0)


def _non_empty(name: str, value: str) -> None:
    if not value.strip():
        raise FieldError(name, "must be a non-empty string")


# OpenAI keeps 16 metadata pairs, keys of 64 characters and values of 512 at most; each batch
# also carries these two of ours (the chunk it holds, the tag that finds it after a crash).
_OPENAI_METADATA_ADDED = ("chunk_id", "llm_kit_tag")


def _check_openai_metadata(metadata: dict[str, str]) -> None:
    room = 16 - len(_OPENAI_METADATA_ADDED)
    if len(metadata) > room:
        raise FieldError(
            "metadata",
            f"holds {len(metadata)} pairs; OpenAI keeps 16 and each batch also carries "
            f"{' and '.join(_OPENAI_METADATA_ADDED)}, so at most {room}",
        )
    for key, value in metadata.items():
        if key in _OPENAI_METADATA_ADDED:
            raise FieldError("metadata", f"{key!r} is set by mmirage on each batch; rename it")
        if len(key) > 64 or len(value) > 512:
            raise FieldError(
                "metadata", f"{key!r}: OpenAI keeps keys of 64 characters and values of 512"
            )


@dataclass
class BatchProviderConfig:
    """Fields shared by every provider of the ``batch_api`` processor, written inline in its
    ``processors[]`` entry. A custom provider's config subclasses it."""

    # Unknown keys are errors, also in user subclasses (pydantic reads this attribute).
    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    provider: str
    """Provider identifier: `openai`, `anthropic`, `gemini` or a registered custom provider
    (any case). It selects the adapter and which provider-specific fields are accepted."""
    max_chunk_bytes: int = 52_428_800
    """Maximum JSONL file size per batch upload, in bytes (default 50 MB). Local images are
    base64-encoded into the requests and count towards it."""
    max_requests_per_chunk: int | None = None
    """Optional hard cap on the number of requests in a chunk (one provider batch). Unset:
    chunks are bounded by `max_chunk_bytes` only."""
    metadata_output_path: str = ""
    """Base path for batch job metadata receipt files. Suffixes like `.text.<run_id>.jsonl` and
    `.multimodal.<run_id>.jsonl` will be appended. Empty: `batch_metadata` in the pipeline's
    state folder."""
    oversized_request_policy: str = "isolate"
    """Policy for requests exceeding `max_chunk_bytes`: `isolate` (dedicated chunk) or
    `reject` (fail fast)."""
    price_per_mtok: dict[str, float] | None = None
    """USD per million tokens at batch prices, `{input: x, output: y}`, for the cost reports
    when the model is missing from the price table (or its price changed). Unset: the price
    file `MMIRAGE_PRICES` names, else the shipped table (`prices.json`, list prices with each
    provider's batch discount)."""

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
        _check_receipt_base(self.metadata_output_path)
        check_price_per_mtok(self.price_per_mtok)


def _check_receipt_base(path: str) -> None:
    """A receipt base names files (``<base>.text.<run id>.jsonl``): a folder would make
    hidden files inside it (``dir/.text.<run id>.jsonl``)."""
    if path and (path.endswith(("/", os.sep)) or os.path.isdir(path)):
        raise FieldError(
            "metadata_output_path",
            f"'{path}' is a folder; name a file in it, e.g. "
            f"'{os.path.join(path, 'batch_metadata.jsonl')}' (receipts are written beside it "
            "as batch_metadata.text.<run id>.jsonl)",
        )


@dataclass
class OpenAIBatchConfig(BatchProviderConfig):
    """``provider: openai`` — the Files + Batches API (and compatible gateways via base_url).
    Key: ``OPENAI_API_KEY``."""

    provider: str = "openai"
    """`openai`."""
    model: str = "gpt-4.1-mini"
    """Model name for chat completion requests."""
    batch_endpoint: str = "/v1/chat/completions"
    """Target endpoint used by OpenAI batch jobs (must start with `/`)."""
    completion_window: str = "24h"
    """OpenAI batch completion window (only `24h` is supported)."""
    base_url: str | None = None
    """Optional base URL, useful for API-compatible gateways. Unset:
    `https://api.openai.com/v1`."""
    metadata: dict[str, str] = field(default_factory=dict)
    """Key-value pairs sent on batch creation (each batch also gets its `chunk_id` and
    `llm_kit_tag`, so at most 14 pairs; keys up to 64 characters, values up to 512)."""
    temperature: float | None = None
    """Sampling temperature, in [0, 2]. Unset: the provider's default."""
    top_p: float | None = None
    """Nucleus sampling probability, in (0, 1]. Unset: the provider's default."""
    max_tokens: int | None = None
    """Maximum tokens for the generated response. Same limit as `max_completion_tokens`: set
    only one. Unset: the provider's default."""
    max_completion_tokens: int | None = None
    """Maximum tokens for the generated response, under OpenAI's newer name for it. Same limit
    as `max_tokens`: set only one."""
    seed: int | None = None
    """Seed for best-effort deterministic sampling. Unset: none sent."""

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
        _check_openai_metadata(self.metadata)
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise FieldError(
                "max_completion_tokens",
                "max_tokens and max_completion_tokens are two names for one limit; set only one",
            )


@dataclass
class AnthropicBatchConfig(BatchProviderConfig):
    """``provider: anthropic`` — Message Batches. Key: ``ANTHROPIC_API_KEY``."""

    provider: str = "anthropic"
    """`anthropic`."""
    model: str = "claude-haiku-4-5"
    """Model name used in each Messages request body."""
    max_tokens: int = 8192
    """Maximum tokens for the generated response."""
    temperature: float | None = None
    """Sampling temperature, in [0, 1]. Mutually exclusive with `top_p`."""
    top_p: float | None = None
    """Nucleus sampling probability, in (0, 1]. Mutually exclusive with `temperature`."""
    base_url: str | None = None
    """Optional base URL, useful for API-compatible gateways."""
    timeout_seconds: float | None = None
    """Optional request timeout, in seconds, for each call to the provider (uploads and result
    downloads included). Unset: llm_kit's defaults."""

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
    """``provider: gemini`` — Gemini Batch Mode (``batchGenerateContent``). Key:
    ``GEMINI_API_KEY``."""

    provider: str = "gemini"
    """`gemini`."""
    model: str = "gemini-2.5-flash"
    """Model name the batch is created for."""
    base_url: str | None = None
    """Optional base URL, useful for API-compatible gateways."""
    temperature: float | None = None
    """Sampling temperature, in [0, 2]. Unset: the provider's default."""
    top_p: float | None = None
    """Nucleus sampling probability, in (0, 1]. Unset: the provider's default."""
    top_k: int | None = None
    """Sample only from the `top_k` most likely tokens (>= 1). Unset: the provider's default."""
    max_output_tokens: int | None = None
    """Maximum tokens for the generated response. Unset: the provider's default."""
    seed: int | None = None
    """Seed for best-effort deterministic sampling. Unset: none sent."""
    timeout_seconds: float | None = None
    """Optional request timeout, in seconds, for each call to the provider (uploads and result
    downloads included). Unset: llm_kit's defaults."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _non_empty("model", self.model)
        _within("temperature", self.temperature, 0, 2, open_low=False)
        _within("top_p", self.top_p, 0, 1, open_low=True)
        _at_least("top_k", self.top_k, 1)
        _at_least("max_output_tokens", self.max_output_tokens, 1)
        _at_least("timeout_seconds", self.timeout_seconds, 0, strict=True)
