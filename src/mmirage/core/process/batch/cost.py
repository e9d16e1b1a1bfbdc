"""Prices and costs: an estimate before a batch is submitted, the cost of real usage after.

Prices are USD per million tokens, from the first of (per model):

* a processor's ``price_per_mtok`` (an ``llm`` processor's at live rates, a ``batch_api``
  processor's at batch rates), which a ``PriceBook`` built from the config carries
  (``PriceBook.from_config``);
* in Python, ``register_price("my-model", input_per_mtok=0.1, output_per_mtok=0.4)`` (batch);
* the file ``MMIRAGE_PRICES`` names (see ``price_table``);
* the table shipped with mmirage, ``prices.json``: list prices with a date and a source per
  model, and each provider's batch discount.

A model is matched exactly, else by its longest listed prefix (``gpt-4o-mini-2024-07-18`` →
``gpt-4o-mini``). A cost computed from a price older than 6 months logs a warning, once per
table and process. Prices are approximate: long-context tiers cost more, cached input less.

The pre-submission estimate counts what providers bill as input: the messages' text, a few
tokens of framing per request, the JSON schema of a JSON output, and a flat guess per image.
Text tokens are the mean of characters / 4.8 and the count of words and punctuation marks:
within ±25 % of a BPE tokenizer's count on English prose (tests/test_sampling_and_prices.py
checks it against the embedded SmolLM2 model's tokenizer). Output tokens are not known before
the answers come back.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from mmirage.core.process.batch.errors import PriceFileError
from mmirage.core.process.batch.price_table import (
    PRICES_ENV,
    ModelPrice,
    Price,
    Table,
    lookup,
    shipped_table,
    user_table,
)

logger = logging.getLogger(__name__)

PRICES_AS_OF = "2025-11"  # the shipped table's dates (each model has its own in prices.json)
BYTES_PER_TOKEN = 4
CHARS_PER_TOKEN = 4.8  # English prose, BPE tokenizers of 50k-200k entries
REQUEST_FRAMING_TOKENS = 7  # role markers and the answer's start, per request
IMAGE_TOKENS = 765  # a flat guess per image (OpenAI's count for 1024x1024 at high detail)
_PIECES = re.compile(r"\w+|[^\w\s]")  # words and punctuation marks

_registered: Table = {}
_stale_warned: set[str] = set()
# Set for shard processes by the parent that started them, which warned of stale prices.
STALE_SAID_ENV = "MMIRAGE_STALE_PRICES_SAID"


def register_price(model: str, input_per_mtok: float, output_per_mtok: float) -> None:
    """Add or override a model's batch price (USD per million tokens)."""
    _registered[model.strip().lower()] = ModelPrice(
        None, _checked(model, input_per_mtok, output_per_mtok), "register_price"
    )


def unregister_price(model: str) -> None:
    """Forget a price ``register_price`` added (the shipped and file prices stay)."""
    _registered.pop(model.strip().lower(), None)


def _checked(model: str, input_per_mtok: float, output_per_mtok: float) -> Price:
    if input_per_mtok < 0 or output_per_mtok < 0:
        raise ValueError(f"prices must not be negative (model {model!r})")
    return Price(float(input_per_mtok), float(output_per_mtok))


def _configured(prices: dict[str, Price], batch: bool) -> Table:
    label = "the config's price_per_mtok"
    return {
        m: ModelPrice(None if batch else p, p if batch else None, label) for m, p in prices.items()
    }


def _warn_if_stale(model: str, entry: ModelPrice, today: datetime.date | None = None) -> None:
    if entry.table in _stale_warned or not entry.is_stale(today or datetime.date.today()):
        return
    if os.environ.get(STALE_SAID_ENV):  # a shard child: its parent said it, once for all
        return
    _stale_warned.add(entry.table)
    logger.warning(
        "%s: the price of %s dates from %s, over 6 months ago, so the costs shown may be off; "
        "check %s and set price_per_mtok on the processor, or name a newer price file in %s",
        entry.table,
        model,
        entry.date,
        entry.source or "the provider's price page",
        PRICES_ENV,
    )


@dataclass(frozen=True)
class PriceBook:
    """The prices one run uses: its config's ``price_per_mtok`` first (``configured``: batch
    rates of ``batch_api`` processors; ``configured_live``: live rates of ``llm`` processors),
    then the registered prices, the ``MMIRAGE_PRICES`` file and the shipped table."""

    configured: dict[str, Price] = field(default_factory=dict)
    configured_live: dict[str, Price] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: Any) -> PriceBook:
        """The book of every processor of ``config`` (an ``MMirageConfig``)."""
        processors = list(getattr(config, "processors", []))
        book = cls.from_providers(getattr(p, "provider_config", None) for p in processors)
        live = _prices_of(p for p in processors if getattr(p, "type", None) == "llm")
        return cls(book.configured, live)

    @classmethod
    def from_providers(cls, provider_configs: Iterable[Any]) -> PriceBook:
        """The book of ``batch_api`` provider configs (their ``price_per_mtok``: batch rates)."""
        return cls(_prices_of(provider_configs))

    @functools.cached_property
    def _own_tables(self) -> tuple[Table, Table]:
        """The config's prices as tables (batch, live): built once, looked up per row."""
        return _configured(self.configured, True), _configured(self.configured_live, False)

    def _entry(self, model: str | None, batch: bool) -> ModelPrice | None:
        own = self._own_tables[0 if batch else 1]
        return lookup(model, (own, _registered, user_table(), shipped_table()), batch)

    def price_for(self, model: str | None, *, batch: bool = True) -> Price | None:
        """The price of ``model`` (batch rates unless ``batch=False``), or ``None`` when it is
        not known."""
        entry = self._entry(model, batch)
        return None if entry is None else entry.for_mode(batch)

    def estimate_submission(self, model: str, request_bytes: int) -> CostEstimate:
        """An estimate from request bytes alone (bytes / 4: an upper bound, several times too
        high for requests with a schema; ``estimate_input`` counts the text instead)."""
        return self.estimate_input(model, estimate_input_tokens(request_bytes))

    def estimate_input(self, model: str, input_tokens: int) -> CostEstimate:
        """The estimate shown before (or at) submission: ``input_tokens`` at batch prices."""
        entry = self._entry(model, True)
        price = None if entry is None else entry.batch
        if entry is None or price is None:
            return CostEstimate(model, input_tokens, None)
        _warn_if_stale(model, entry)
        priced_on = None if entry.date is None else entry.date.isoformat()
        return CostEstimate(model, input_tokens, price.cost(input_tokens, 0), priced_on)

    def usage_cost(
        self, model: str | None, input_tokens: int, output_tokens: int, *, batch: bool = True
    ) -> float | None:
        """The cost of real usage (batch rates unless ``batch=False``), or ``None`` when the
        price is not known. Warns once when the price is over 6 months old."""
        entry = self._entry(model, batch)
        price = None if entry is None else entry.for_mode(batch)
        if entry is None or price is None:
            return None
        _warn_if_stale(str(model), entry)
        return price.cost(input_tokens, output_tokens)


def say_stale_prices(config: Any) -> None:
    """Warn now, once per table, of every processor's model whose price is over 6 months old:
    a parent says it for the shard processes it starts (``STALE_SAID_ENV`` keeps them quiet)."""
    book = PriceBook.from_config(config)
    for processor in getattr(config, "processors", []):
        batch = getattr(processor, "provider_config", None)
        model = getattr(batch if batch is not None else processor, "model", None)
        entry = book._entry(model, batch is not None) if model else None
        if entry is not None and entry.for_mode(batch is not None) is not None:
            _warn_if_stale(str(model), entry)


def _prices_of(configs: Iterable[Any]) -> dict[str, Price]:
    prices: dict[str, Price] = {}
    for config in configs:
        price = getattr(config, "price_per_mtok", None)
        model = getattr(config, "model", None)
        if price and model:
            prices[model.strip().lower()] = _checked(model, price["input"], price["output"])
    return prices


_DEFAULT_BOOK = PriceBook()  # what the module-level functions use: no config prices


def price_for(model: str | None) -> Price | None:
    """The batch price of ``model`` without any config's prices, or ``None``."""
    return _DEFAULT_BOOK.price_for(model)


def estimate_input_tokens(request_bytes: int) -> int:
    """Input tokens of request lines totalling ``request_bytes`` UTF-8 bytes (bytes / 4)."""
    return -(-request_bytes // BYTES_PER_TOKEN)


def estimate_text_tokens(text: str) -> int:
    """Tokens of ``text``: the mean of characters / 4.8 and the words and punctuation marks."""
    if not text:
        return 0
    pieces = sum(1 for _ in _PIECES.finditer(text))
    return round((len(text) / CHARS_PER_TOKEN + pieces) / 2)


def schema_tokens(schema: dict[str, Any] | None) -> int:
    """Tokens of a JSON output's schema, which providers bill with every request."""
    if not schema:
        return 0
    return estimate_text_tokens(orjson.dumps(schema).decode())


def estimate_request_tokens(prompt: str | None, schema: int = 0, images: int = 0) -> int:
    """Input tokens of one request: its prompt, its framing, ``schema`` tokens and images."""
    return (
        estimate_text_tokens(prompt or "")
        + REQUEST_FRAMING_TOKENS
        + schema
        + images * (IMAGE_TOKENS)
    )


@dataclass(frozen=True)
class CostEstimate:
    model: str
    input_tokens: int
    input_cost: float | None  # None: the model's price is not known
    priced_on: str | None = None  # the date of the price used, when its table says

    def describe(self) -> str:
        tokens = f"~{self.input_tokens:,} input tokens"
        if self.input_cost is None:
            return (
                f"{tokens} for {self.model} (no known batch price: set price_per_mtok on the "
                f"processor or see {PRICES_ENV})"
            )
        dated = f", prices of {self.priced_on}" if self.priced_on else ""
        return (
            f"{tokens} for {self.model}: ~{format_usd(self.input_cost)} of input at batch "
            f"prices (approximate{dated}); output tokens are not known before the batches "
            "finish"
        )


def estimate_submission(model: str, request_bytes: int) -> CostEstimate:
    return _DEFAULT_BOOK.estimate_submission(model, request_bytes)


def usage_cost(model: str | None, input_tokens: int, output_tokens: int) -> float | None:
    return _DEFAULT_BOOK.usage_cost(model, input_tokens, output_tokens)


def format_usd(amount: float) -> str:
    return f"${amount:,.4f}" if amount < 1 else f"${amount:,.2f}"


def register_config_prices(config: Any) -> None:
    """Register the ``price_per_mtok`` of every batch_api processor of ``config`` process-wide
    (kept for callers of this name; a run passes ``PriceBook.from_config`` instead)."""
    for model, price in PriceBook.from_config(config).configured.items():
        register_price(model, price.input_per_mtok, price.output_per_mtok)


__all__ = [
    "PRICES_AS_OF",
    "PRICES_ENV",
    "STALE_SAID_ENV",
    "CostEstimate",
    "Price",
    "PriceBook",
    "PriceFileError",
    "estimate_input_tokens",
    "estimate_request_tokens",
    "estimate_submission",
    "estimate_text_tokens",
    "format_usd",
    "price_for",
    "register_config_prices",
    "register_price",
    "say_stale_prices",
    "schema_tokens",
    "unregister_price",
    "usage_cost",
]
