"""What an answer comes to: a success, or a failure of a kind that says whether asking again helps.

A JSON answer that the token limit cut off (``truncated``) comes back the same way every time it
is asked again identically, so it is never re-asked; one that misses the schema (``validation``)
is re-asked with what was wrong (``reask``), a few times, then recorded for good. Neither is
``retryable``: running the item again would pay for the same answer again. The live pipeline
and the provider batch path judge answers here, so that both say the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel

from llm_kit.errors import ResponseValidationError
from llm_kit.schema import ResponseSchema, parse_response
from llm_kit.types import BatchItem, BatchResult, Completion, Message, Usage

TRUNCATED = "truncated"
VALIDATION = "validation"
REFUSAL = "refusal"
# Failures no rerun can change: the same request gets the same answer (or refusal) again.
PERMANENT_KINDS = frozenset({TRUNCATED, VALIDATION, REFUSAL, "invalid_item"})
# How each provider says "finished normally" (OpenAI and the local engine, Anthropic, Gemini).
# A text answer that ended otherwise (cut at the limit, filtered) is worth recording as such.
ORDINARY_STOPS = frozenset({"stop", "end_turn", "stop_sequence", "STOP", None})
# Sampling names of the answer's token limit (llm_kit's, then OpenAI's newer one).
_MAX_TOKEN_KEYS = ("max_tokens", "max_completion_tokens")
_QUOTED_ANSWER = 2000  # characters of a rejected answer quoted back, at most


@dataclass(slots=True)
class Verdict:
    """A judged answer: ``response`` when it is usable, else ``error`` and its ``kind``."""

    response: Any = None
    error: str | None = None
    kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.kind is None


def judge(
    completion: Completion, model: type[BaseModel] | None, max_tokens: int | None = None
) -> Verdict:
    """The answer as the item's result: its text, its validated ``model`` instance, or why not.

    A JSON answer that does not parse or validate is ``truncated`` when the provider said the
    token limit stopped it (``max_tokens``, when known, is named in the error), else
    ``validation``. A plain-text answer cut at the limit is still an answer.
    """
    if completion.refusal:
        return Verdict(error=f"refused: {completion.refusal}", kind=REFUSAL)
    if model is None:
        return Verdict(completion.text)
    try:
        return Verdict(parse_response(completion.text, model))
    except ResponseValidationError as exc:
        if completion.cut:
            error = truncated_error(completion.finish_reason, max_tokens)
            return Verdict(error=error, kind=TRUNCATED)
        return Verdict(error=str(exc), kind=VALIDATION)


def failed_result(
    item: BatchItem,
    error: str,
    kind: str,
    retryable: bool,
    attempts: int,
    usage: Usage | None = None,
    finish_reason: str | None = None,
) -> BatchResult:
    """A failed item's result; ``finish_reason`` is the last answer's, when one came."""
    return BatchResult(
        item.id,
        False,
        error=error,
        error_kind=kind,
        retryable=retryable,
        usage=usage if usage and usage.total_tokens else None,
        metadata=item.metadata,
        attempts=attempts,
        finish_reason=finish_reason,
    )


def truncated_error(
    finish_reason: str | None, max_tokens: int | None, setting: str = "max_new_tokens"
) -> str:
    """One sentence: the answer was cut, and what to change: ``setting`` (the configuration's
    name of the limit), with its value when known."""
    fix = f"raise {setting} (now {max_tokens})" if max_tokens else f"set {setting}"
    return f"the answer was cut at the token limit (finish_reason {finish_reason!r}): {fix}"


def max_tokens_of(sampling: Mapping[str, Any] | None) -> int | None:
    """The answer's token limit that ``sampling`` sets, or None (the provider's default)."""
    for key in _MAX_TOKEN_KEYS:
        value = (sampling or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def reask(
    messages: Sequence[Message], answer: str | None, error: str, schema: ResponseSchema
) -> list[Message]:
    """The conversation asked again after an answer missed the schema: the answer as the
    assistant's turn, then a user turn that says what was wrong and asks for matching JSON
    (an identical request would mostly get the identical answer, at temperature 0 always)."""
    quoted = (answer or "")[:_QUOTED_ANSWER] or "(no text)"
    schema_text = orjson.dumps(schema.schema).decode()
    correction = (
        f"That answer is not usable: {error}. Answer again with only a JSON value that "
        f"matches this JSON schema, and nothing else: {schema_text}"
    )
    return [*messages, Message.assistant(quoted), Message.user(correction)]


__all__ = [
    "ORDINARY_STOPS",
    "PERMANENT_KINDS",
    "REFUSAL",
    "TRUNCATED",
    "VALIDATION",
    "Verdict",
    "failed_result",
    "judge",
    "max_tokens_of",
    "reask",
    "truncated_error",
]
