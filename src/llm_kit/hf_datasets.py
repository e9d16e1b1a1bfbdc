"""Hugging Face ``datasets`` in and out: items from a dataset's rows, results back as a
``Dataset``.

``items_from_dataset`` only iterates what it is given (a ``Dataset``, an ``IterableDataset``, a
list of dicts), lazily, so it imports nothing. ``results_to_dataset`` builds a
``datasets.Dataset``: it needs the ``datasets`` package, which the ``hf`` extra installs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
from pydantic import BaseModel

from llm_kit.errors import ConfigError, require_extra
from llm_kit.types import BatchItem, BatchResult, Message

Prompt = str | Callable[[Mapping[str, Any]], str | list[Message]]

# The columns every result has, in this order; an item's metadata keys follow.
RESULT_COLUMNS = (
    "id",
    "ok",
    "response",
    "error",
    "error_kind",
    "retryable",
    "input_tokens",
    "output_tokens",
    "finish_reason",
    "attempts",
)


def items_from_dataset(
    dataset: Iterable[Mapping[str, Any]],
    *,
    id_column: str,
    prompt: Prompt,
    system: str | None = None,
    keep_columns: Sequence[str] = (),
    response_model: type[BaseModel] | None = None,
    sampling: dict[str, Any] | None = None,
) -> Iterator[BatchItem]:
    """One ``BatchItem`` per row, read as the sink takes them (a streamed dataset stays one).

    ``prompt`` is a ``str.format`` template over the row's columns (``"Summarise: {text}"``) or
    a function of the row returning the user text or the whole list of messages; ``system`` is
    put first when the prompt is text. ``keep_columns`` travel as the item's metadata and come
    back as columns of ``results_to_dataset``. Raises ``ConfigError`` naming the row and the
    column when a row has no usable id or lacks a column the prompt names."""
    for position, row in enumerate(dataset):
        item_id = _item_id(row, id_column, position)
        made = prompt(row) if callable(prompt) else _fill(prompt, row, item_id)
        messages = _messages(made, system)
        metadata = {name: _column(row, name, item_id, "keep_columns") for name in keep_columns}
        yield BatchItem(item_id, messages, response_model, metadata, sampling)


def _item_id(row: Mapping[str, Any], id_column: str, position: int) -> str:
    value = _column(row, id_column, f"at position {position}", "id_column")
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise ConfigError(
            f"row at position {position}: its {id_column!r} value {value!r} is no id; the "
            "id_column must hold a non-empty string or an integer in every row"
        )
    return str(value)


def _column(row: Mapping[str, Any], name: str, row_name: str, argument: str) -> Any:
    try:
        return row[name]
    except KeyError:
        columns = ", ".join(repr(c) for c in row)
        raise ConfigError(
            f"row {row_name} has no column {name!r} (the {argument}); its columns are {columns}"
        ) from None


def _fill(template: str, row: Mapping[str, Any], item_id: str) -> str:
    try:
        return template.format_map(row)
    except KeyError as exc:
        columns = ", ".join(repr(c) for c in row)
        raise ConfigError(
            f"row {item_id!r}: the prompt names the column {exc.args[0]!r}, which the row does "
            f"not have; its columns are {columns}"
        ) from None
    except (ValueError, IndexError, AttributeError) as exc:
        raise ConfigError(
            f"the prompt is not a str.format template over the row's columns ({exc}); write "
            "{column} for a value and {{ }} for a literal brace"
        ) from None


def _messages(made: str | list[Message], system: str | None) -> list[Message]:
    if not isinstance(made, str):
        return list(made)  # the whole conversation, as the prompt function made it
    user = Message.user(made)
    return [user] if system is None else [Message.system(system), user]


def results_to_dataset(results: Iterable[BatchResult]) -> Any:
    """The results as a ``datasets.Dataset``, in the order given (``.sort("id")`` for the
    items' order when the ids sort so): the columns of ``RESULT_COLUMNS``, then one per
    metadata key (``keep_columns`` of ``items_from_dataset``). A ``response_model`` answer is a
    struct column; when text and structured answers are mixed, the structured ones are JSON
    text. Built in memory: for millions of results, write them with ``batch_to_jsonl`` and load
    that file with ``datasets.load_dataset("json", ...)``."""
    datasets = require_extra("datasets", "hf", "results_to_dataset")
    columns: dict[str, list[Any]] = {name: [] for name in RESULT_COLUMNS}
    for count, result in enumerate(results):
        for name, value in _record(result).items():
            if name not in columns:
                columns[name] = [None] * count  # a key the earlier results did not have
            columns[name].append(value)
        for values in columns.values():
            if len(values) == count:  # a key this result does not have
                values.append(None)
    _one_kind_of_response(columns["response"])
    try:
        return datasets.Dataset.from_dict(columns)
    except (TypeError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(
            f"the results do not make a dataset ({exc}); a metadata key must hold values of "
            "one type in every item"
        ) from None


def _record(result: BatchResult) -> dict[str, Any]:
    response = result.response
    if isinstance(response, BaseModel):
        response = response.model_dump(mode="json")
    usage = result.usage
    record = {
        "id": result.id,
        "ok": result.ok,
        "response": response,
        "error": result.error,
        "error_kind": result.error_kind,
        "retryable": result.retryable,
        "input_tokens": None if usage is None else usage.input_tokens,
        "output_tokens": None if usage is None else usage.output_tokens,
        "finish_reason": result.finish_reason,
        "attempts": result.attempts,
    }
    for key, value in result.metadata.items():
        if key in record:
            raise ConfigError(
                f"item {result.id!r}: the metadata key {key!r} is also a result column; "
                "rename it (keep_columns cannot keep a column of that name)"
            )
        record[key] = value
    return record


def _one_kind_of_response(responses: list[Any]) -> None:
    """Text and structured answers cannot share an Arrow column: the structured become JSON."""
    if any(isinstance(r, str) for r in responses):
        for at, response in enumerate(responses):
            if response is not None and not isinstance(response, str):
                responses[at] = orjson.dumps(response).decode()


@contextmanager
def quiet_datasets(datasets: Any) -> Iterator[None]:
    """No progress bar nor cache notice from ``datasets`` (the imported module) meanwhile:
    they would garble a command's own output (its errors are raised, not logged)."""
    logging = datasets.utils.logging
    verbosity, bars_were_off = logging.get_verbosity(), datasets.utils.are_progress_bars_disabled()
    logging.set_verbosity_error()
    datasets.utils.disable_progress_bars()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if not bars_were_off:
            datasets.utils.enable_progress_bars()
