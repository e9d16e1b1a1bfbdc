"""The price tables: the one shipped with mmirage (``prices.json``, package data) and a user's
file named by ``MMIRAGE_PRICES``; each model's list and batch price with its date and source.

Both files take the same shape: ``{"batch_discount": {provider: fraction}, "models": {model:
{"provider", "input", "output", "date", "source"}}}``, prices in USD per 1M tokens at list
(pay-as-you-go) rates; a batch price is the list price times ``1 - batch_discount``. A user
file may instead be a flat map ``{model: {"input": x, "output": y}}`` or ``{model: [x, y]}``:
batch prices only, as this file has always read.
"""

from __future__ import annotations

import datetime
import functools
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from mmirage.core.process.batch.errors import PriceFileError

PRICES_ENV = "MMIRAGE_PRICES"
SHIPPED_NAME = "prices.json"
DEFAULT_BATCH_DISCOUNT = 0.5  # OpenAI, Anthropic and Gemini all take half off for batches
STALE_AFTER_DAYS = 183  # about 6 months: prices older than this are said to be so, once


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6

    def discounted(self, discount: float) -> Price:
        return Price(self.input_per_mtok * (1 - discount), self.output_per_mtok * (1 - discount))


@dataclass(frozen=True)
class ModelPrice:
    """One model's prices in one table: live (``None``: not known there) and batch."""

    live: Price | None
    batch: Price | None
    table: str  # the file it came from, named in the staleness warning
    date: datetime.date | None = None
    source: str | None = None

    def for_mode(self, batch: bool) -> Price | None:
        return self.batch if batch else self.live

    def is_stale(self, today: datetime.date) -> bool:
        return self.date is not None and (today - self.date).days > STALE_AFTER_DAYS


Table = dict[str, ModelPrice]


@functools.cache
def _shipped_data() -> dict[str, Any]:
    ref = resources.files("mmirage.core.process.batch").joinpath(SHIPPED_NAME)
    data: dict[str, Any] = orjson.loads(ref.read_bytes())
    return data


def _shipped_discounts() -> dict[str, float]:
    return _discounts({}, SHIPPED_NAME, _shipped_data())


@functools.cache
def shipped_table() -> Table:
    """The table shipped with mmirage (read once per process)."""
    return _table(_shipped_data(), SHIPPED_NAME, _shipped_discounts())


_user_cache: tuple[tuple[str, float], Table] | None = None


def user_table() -> Table:
    """The prices of the ``MMIRAGE_PRICES`` file (read again only when it changes)."""
    global _user_cache
    path = os.environ.get(PRICES_ENV, "").strip()
    if not path:
        return {}
    try:
        stamp = (path, os.path.getmtime(path))
        if _user_cache is not None and _user_cache[0] == stamp:
            return _user_cache[1]
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
    label = f"{PRICES_ENV} file {path}"
    if isinstance(data.get("models"), dict):
        table = _table(data, label, _discounts(_shipped_discounts(), label, data))
    else:
        table = {_key(m): _flat_entry(str(m), e, label) for m, e in data.items()}
    _user_cache = (stamp, table)
    return table


def _key(model: str) -> str:
    return model.strip().lower()


def _discounts(base: dict[str, float], label: str, data: dict[str, Any]) -> dict[str, float]:
    found = dict(base)
    for provider, value in (data.get("batch_discount") or {}).items():
        if not _number(value) or not 0 <= value < 1:
            raise PriceFileError(
                f"{label}: batch_discount of {provider!r} must be a fraction in [0, 1)"
            )
        found[str(provider).lower()] = float(value)
    return found


def _table(data: dict[str, Any], label: str, discounts: dict[str, float]) -> Table:
    table: Table = {}
    for model, entry in data["models"].items():
        if not isinstance(entry, dict) or not _number(entry.get("input")):
            raise PriceFileError(
                f"{label}: the price of {model!r} must be "
                '{"input": X, "output": Y, ...} (USD per 1M tokens, list price)'
            )
        live = _pair(str(model), [entry.get("input"), entry.get("output")], label)
        discount = entry.get(
            "batch_discount", discounts.get(str(entry.get("provider", "")).lower())
        )
        if discount is None:
            discount = DEFAULT_BATCH_DISCOUNT
        table[_key(str(model))] = ModelPrice(
            live,
            live.discounted(float(discount)),
            label,
            _date(str(model), entry.get("date"), label),
            entry.get("source"),
        )
    return table


def _flat_entry(model: str, entry: Any, label: str) -> ModelPrice:
    if isinstance(entry, dict) and {"input", "output"} <= set(entry):
        values = [entry["input"], entry["output"]]
    elif isinstance(entry, list) and len(entry) == 2:
        values = list(entry)
    else:
        raise PriceFileError(
            f"{label}: the price of {model!r} must be "
            '{"input": X, "output": Y} or [X, Y] (USD per 1M tokens)'
        )
    return ModelPrice(None, _pair(model, values, label), label)


def _pair(model: str, values: list[Any], label: str) -> Price:
    if not all(_number(v) and v >= 0 for v in values):
        raise PriceFileError(f"{label}: the price of {model!r} needs two non-negative numbers")
    return Price(float(values[0]), float(values[1]))


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _date(model: str, value: Any, label: str) -> datetime.date | None:
    if value is None:
        return None
    try:
        return datetime.date.fromisoformat(str(value))
    except ValueError:
        raise PriceFileError(
            f"{label}: the date of {model!r} must be YYYY-MM-DD, got {value!r}"
        ) from None


def lookup(model: str | None, tables: tuple[Table, ...], batch: bool) -> ModelPrice | None:
    """``model``'s entry in the first table that prices it for the mode: exactly, else by its
    longest listed prefix (``gpt-4o-mini-2024-07-18`` → ``gpt-4o-mini``)."""
    if not model:
        return None
    name = _key(model)
    for table in tables:
        entry = table.get(name)
        if entry is not None and entry.for_mode(batch) is not None:
            return entry
    for table in tables:
        prefixes = [k for k, e in table.items() if name.startswith(k) and e.for_mode(batch)]
        if prefixes:
            return table[max(prefixes, key=len)]
    return None
