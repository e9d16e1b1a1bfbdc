"""Batch prices: an estimate before submission, the cost from real usage after merge.

Prices are USD per million tokens at **batch** rates (50 % of each provider's list price), for
common models, as published around ``PRICES_AS_OF``. They are approximate: providers change
prices, long-context tiers cost more, cached input costs less. A model is matched exactly, else
by its longest listed prefix (``gpt-4o-mini-2024-07-18`` → ``gpt-4o-mini``), so dated snapshots
find their family.

Extend or override the table (first wins):

* in the config, a batch_api processor's ``price_per_mtok`` for its model: a ``PriceBook``
  built from the config (``PriceBook.from_config``) carries it to whoever prices the run;
* in Python, ``register_price("my-model", input_per_mtok=0.1, output_per_mtok=0.4)``;
* from the shell, ``MMIRAGE_PRICES=/path/prices.json`` where the file maps a model to
  ``{"input": 0.1, "output": 0.4}`` or ``[0.1, 0.4]`` (USD per 1M tokens, batch rate).

The pre-submission estimate counts input tokens as UTF-8 bytes / 4 of the request lines. It is a
rough upper bound for text and a large overestimate for inlined images (base64 bytes are not
image tokens); output tokens are unknown until the batches are back.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from mmirage.errors import UserError

PRICES_AS_OF = "2025-11"
PRICES_ENV = "MMIRAGE_PRICES"
BYTES_PER_TOKEN = 4


@dataclass(frozen=True)
class Price:
    """USD per million tokens, batch rate."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


def _half(input_list: float, output_list: float) -> Price:
    return Price(input_list / 2, output_list / 2)


# List prices (USD / 1M tokens) halved for batch; approximate, as of PRICES_AS_OF.
_BUILT_IN: dict[str, Price] = {
    # OpenAI
    "gpt-4o": _half(2.50, 10.00),
    "gpt-4o-mini": _half(0.15, 0.60),
    "gpt-4.1": _half(2.00, 8.00),
    "gpt-4.1-mini": _half(0.40, 1.60),
    "gpt-4.1-nano": _half(0.10, 0.40),
    "gpt-5": _half(1.25, 10.00),
    "gpt-5-mini": _half(0.25, 2.00),
    "gpt-5-nano": _half(0.05, 0.40),
    "o3": _half(2.00, 8.00),
    "o3-mini": _half(1.10, 4.40),
    "o4-mini": _half(1.10, 4.40),
    # Anthropic
    "claude-haiku-4-5": _half(1.00, 5.00),
    "claude-3-5-haiku": _half(0.80, 4.00),
    "claude-3-haiku": _half(0.25, 1.25),
    "claude-sonnet-4-5": _half(3.00, 15.00),
    "claude-sonnet-4": _half(3.00, 15.00),
    "claude-3-7-sonnet": _half(3.00, 15.00),
    "claude-opus-4-5": _half(5.00, 25.00),
    "claude-opus-4-1": _half(15.00, 75.00),
    "claude-opus-4": _half(15.00, 75.00),
    # Google Gemini (prompts up to 200k tokens)
    "gemini-2.5-pro": _half(1.25, 10.00),
    "gemini-2.5-flash": _half(0.30, 2.50),
    "gemini-2.5-flash-lite": _half(0.10, 0.40),
    "gemini-2.0-flash": _half(0.10, 0.40),
    "gemini-2.0-flash-lite": _half(0.075, 0.30),
}

_registered: dict[str, Price] = {}
_env_cache: tuple[tuple[str, float], dict[str, Price]] | None = None


class PriceFileError(UserError, ValueError):
    """``MMIRAGE_PRICES`` names a file that cannot be used; ``str(err)`` says why."""


def register_price(model: str, input_per_mtok: float, output_per_mtok: float) -> None:
    """Add or override a model's batch price (USD per million tokens)."""
    _registered[model.strip().lower()] = _checked(model, input_per_mtok, output_per_mtok)


def unregister_price(model: str) -> None:
    """Forget a price ``register_price`` added (the built-in and file prices stay)."""
    _registered.pop(model.strip().lower(), None)


def _checked(model: str, input_per_mtok: float, output_per_mtok: float) -> Price:
    if input_per_mtok < 0 or output_per_mtok < 0:
        raise ValueError(f"prices must not be negative (model {model!r})")
    return Price(float(input_per_mtok), float(output_per_mtok))


def _price_of(model: str, entry: Any, path: str) -> Price:
    if isinstance(entry, dict) and {"input", "output"} <= set(entry):
        values = [entry["input"], entry["output"]]
    elif isinstance(entry, list) and len(entry) == 2:
        values = list(entry)
    else:
        raise PriceFileError(
            f"{PRICES_ENV} file {path}: the price of {model!r} must be "
            '{"input": X, "output": Y} or [X, Y] (USD per 1M tokens)'
        )
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in values):
        raise PriceFileError(
            f"{PRICES_ENV} file {path}: the price of {model!r} needs two non-negative numbers"
        )
    return Price(float(values[0]), float(values[1]))


def _env_prices() -> dict[str, Price]:
    """The prices of the ``MMIRAGE_PRICES`` file (read again only when it changes)."""
    global _env_cache
    path = os.environ.get(PRICES_ENV, "").strip()
    if not path:
        return {}
    try:
        stamp = (path, os.path.getmtime(path))
        if _env_cache is not None and _env_cache[0] == stamp:
            return _env_cache[1]
        data = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise PriceFileError(
            f"{PRICES_ENV} names {path}, which cannot be read ({exc.strerror or exc}); "
            "fix the path or unset it"
        ) from None
    except orjson.JSONDecodeError:
        raise PriceFileError(f"{PRICES_ENV} file {path} is not valid JSON") from None
    if not isinstance(data, dict):
        raise PriceFileError(f"{PRICES_ENV} file {path} must map model names to prices")
    prices = {str(m).strip().lower(): _price_of(str(m), e, path) for m, e in data.items()}
    _env_cache = (stamp, prices)
    return prices


def _lookup(model: str | None, tables: tuple[dict[str, Price], ...]) -> Price | None:
    if not model:
        return None
    name = model.strip().lower()
    for table in tables:
        if name in table:
            return table[name]
    for table in tables:
        prefixes = [key for key in table if name.startswith(key)]
        if prefixes:
            return table[max(prefixes, key=len)]
    return None


@dataclass(frozen=True)
class PriceBook:
    """The prices one run uses: its config's ``price_per_mtok`` first, then the registered
    prices, the ``MMIRAGE_PRICES`` file and the built-in table."""

    configured: dict[str, Price] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Any) -> PriceBook:
        """The book of every batch_api processor of ``config`` (an ``MMirageConfig``)."""
        return cls.from_providers(
            getattr(p, "provider_config", None) for p in getattr(config, "processors", [])
        )

    @classmethod
    def from_providers(cls, provider_configs: Iterable[Any]) -> PriceBook:
        configured: dict[str, Price] = {}
        for provider_config in provider_configs:
            price = getattr(provider_config, "price_per_mtok", None)
            model = getattr(provider_config, "model", None)
            if price and model:
                configured[model.strip().lower()] = _checked(model, price["input"], price["output"])
        return cls(configured)

    def price_for(self, model: str | None) -> Price | None:
        """The batch price of ``model``, or ``None`` when it is not known."""
        return _lookup(model, (self.configured, _registered, _env_prices(), _BUILT_IN))

    def estimate_submission(self, model: str, request_bytes: int) -> CostEstimate:
        """The estimate shown before (or at) submission: input only, from the request bytes."""
        tokens = estimate_input_tokens(request_bytes)
        price = self.price_for(model)
        return CostEstimate(model, tokens, None if price is None else price.cost(tokens, 0))

    def usage_cost(self, model: str | None, input_tokens: int, output_tokens: int) -> float | None:
        """The cost of real usage at batch prices, or ``None`` when the price is not known."""
        price = self.price_for(model)
        return None if price is None else price.cost(input_tokens, output_tokens)


_DEFAULT_BOOK = PriceBook()  # what the module-level functions use: no config prices


def price_for(model: str | None) -> Price | None:
    """The batch price of ``model`` without any config's prices, or ``None``."""
    return _DEFAULT_BOOK.price_for(model)


def estimate_input_tokens(request_bytes: int) -> int:
    """Input tokens of request lines totalling ``request_bytes`` UTF-8 bytes (bytes / 4)."""
    return -(-request_bytes // BYTES_PER_TOKEN)


@dataclass(frozen=True)
class CostEstimate:
    model: str
    input_tokens: int
    input_cost: float | None  # None: the model's price is not known

    def describe(self) -> str:
        tokens = f"~{self.input_tokens:,} input tokens"
        if self.input_cost is None:
            return f"{tokens} for {self.model} (no known batch price: see {PRICES_ENV})"
        return (
            f"{tokens} for {self.model}: ~{format_usd(self.input_cost)} of input at batch "
            f"prices (approximate, prices as of {PRICES_AS_OF}); output tokens are not known "
            "before the batches finish"
        )


def estimate_submission(model: str, request_bytes: int) -> CostEstimate:
    return _DEFAULT_BOOK.estimate_submission(model, request_bytes)


def usage_cost(model: str | None, input_tokens: int, output_tokens: int) -> float | None:
    return _DEFAULT_BOOK.usage_cost(model, input_tokens, output_tokens)


def format_usd(amount: float) -> str:
    return f"${amount:,.4f}" if amount < 1 else f"${amount:,.2f}"


__all__ = [
    "PRICES_AS_OF",
    "PRICES_ENV",
    "CostEstimate",
    "Price",
    "PriceBook",
    "PriceFileError",
    "estimate_input_tokens",
    "estimate_submission",
    "format_usd",
    "price_for",
    "register_config_prices",
    "register_price",
    "unregister_price",
    "usage_cost",
]


def register_config_prices(config: Any) -> None:
    """Register the ``price_per_mtok`` of every batch_api processor of ``config`` process-wide
    (kept for callers of this name; a run passes ``PriceBook.from_config`` instead)."""
    for model, price in PriceBook.from_config(config).configured.items():
        _registered[model] = price
