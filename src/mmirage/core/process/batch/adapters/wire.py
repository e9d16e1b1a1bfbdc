"""Conversions between mmirage's adapter contract and llm_kit's batch objects: the neutral
payload → a provider request body, requests → a spool file, an llm_kit ``Outcome`` → a result
row. Pure functions: no HTTP, no event loop (``_common`` runs those)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from llm_kit.errors import ConfigError, ImageTypeError, ItemError
from llm_kit.providers.base import Codec
from llm_kit.providers.batch_backend import Chunk, Outcome
from llm_kit.schema import ResponseSchema, schema_from_dict
from llm_kit.types import Message

# The schema name sent since the first release (OpenAI requires one, the others ignore it):
# kept so that request bodies, and so receipts' byte counts, stay the same.
SCHEMA_NAME = "structured_output"


def encode_payload(
    codec: Codec,
    model: str,
    custom_id: str,
    payload: Mapping[str, Any],
    sampling: Mapping[str, Any],
    schema: ResponseSchema | None = None,
) -> dict[str, Any]:
    """The neutral payload → the provider's request body, through llm_kit's codec
    (``schema``: the payload's ``response_schema`` already converted, when the caller has it).

    Content the provider refuses (an image type it cannot read, an unreadable file) raises
    ValueError naming the request, before anything is submitted.
    """
    if not payload.get("messages"):
        raise ValueError(f"request {custom_id}: the payload has no 'messages'")
    try:
        messages = [Message.coerce(m) for m in payload["messages"]]
        if schema is None:
            schema = payload_schema(payload.get("response_schema"))
        return codec.encode(model, messages, sampling, schema)
    except ImageTypeError as exc:  # the processor stops the run on it, before submitting
        raise ImageTypeError(f"request {custom_id}: {exc}", media_type=exc.media_type) from None
    except (ConfigError, ItemError) as exc:
        raise ValueError(f"request {custom_id}: {exc}") from None


def payload_schema(schema: Any) -> ResponseSchema | None:
    """llm_kit's form of the output's JSON schema; it decides whether OpenAI's strict mode
    fits (every property required, no free-form maps)."""
    if not schema:
        return None
    if not isinstance(schema, Mapping):
        raise ConfigError(f"response_schema must be a JSON schema object, got {schema!r}")
    return schema_from_dict(SCHEMA_NAME, dict(schema))


def sampling_of(**values: Any) -> dict[str, Any]:
    """Only the fields that are set: an unset one leaves the provider's default."""
    return {key: value for key, value in values.items() if value is not None}


def write_chunk(directory: Path, chunk_id: str, requests: Sequence[dict[str, Any]]) -> Chunk:
    """The requests as a JSONL spool file (``batch_chunk-<id>.jsonl``: the upload names
    users already know)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", chunk_id) or "chunk"
    path = directory / f"batch_chunk-{name}.jsonl"
    size = 0
    with open(path, "wb") as f:
        for request in requests:
            line = orjson.dumps(request, option=orjson.OPT_APPEND_NEWLINE)
            f.write(line)
            size += len(line)
    return Chunk(path=path, first=0, count=len(requests), bytes=size)


def result_row(outcome: Outcome) -> dict[str, Any]:
    """An llm_kit outcome → the adapter contract's result row.

    Usage is reported only when the provider reported some: the codecs read a missing usage
    block as zeros, and no real request costs zero input tokens.
    """
    row: dict[str, Any] = {"custom_id": outcome.custom_id}
    completion = outcome.completion
    if completion is None:
        row.update(
            status="error",
            error_message=outcome.error or "the provider gave no reason",
            error_kind=outcome.kind or "errored",
            retryable=outcome.retryable,
        )
        return row
    if completion.refusal is not None:
        row.update(
            status="error",
            error_message=f"the model refused: {completion.refusal}",
            error_kind="refusal",
            retryable=False,
        )
    else:
        row.update(status="succeeded", generated_text=completion.text or "")
    if completion.finish_reason is not None:  # merge tells a JSON answer cut at the limit
        row["finish_reason"] = completion.finish_reason
    usage = completion.usage
    if usage.input_tokens or usage.output_tokens:
        row.update(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
    return row
