"""What the results store holds, as plain values: a provider batch (``BatchRecord``), the latest
outcome of one request (``RequestOutcome``, one of ``OUTCOMES``), and the request ids they are
keyed by (``<tag>-<source_index>``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_kit.provider_json import mend_text

SUCCEEDED, FAILED, EXPIRED, CANCELED, MISSING, RUNNING = (
    "succeeded",
    "failed",
    "expired",
    "canceled",
    "missing",
    "running",
)
OUTCOMES = (SUCCEEDED, FAILED, EXPIRED, CANCELED, MISSING, RUNNING)


def split_id(custom_id: str) -> tuple[int, str]:
    """``answer-text-42`` → ``(42, "answer-text")``; any other shape → ``(-1, custom_id)``."""
    tag, _, number = custom_id.rpartition("-")
    if tag and number.isdigit() and (number == "0" or not number.startswith("0")):
        return int(number), tag
    return -1, custom_id


def join_id(source_index: int, tag: str) -> str:
    return tag if source_index < 0 else f"{tag}-{source_index}"


@dataclass(frozen=True)
class BatchRecord:
    """What the store knows of one provider batch (from its receipt, then from polling)."""

    provider: str
    batch_id: str
    processor: str | None = None
    modality: str | None = None
    spool_path: str | None = None
    submitted_at: str = ""
    request_count: int = 0
    status: str | None = None
    provider_status: str | None = None
    fetched: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.provider, self.batch_id)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """The latest outcome of one request, as merge and retry use it."""

    custom_id: str
    state: str  # one of OUTCOMES
    text: str | None = None
    message: str | None = None
    retryable: bool | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reason: str | None = None  # why the answer ended, in the provider's words

    @property
    def ok(self) -> bool:
        return self.state == SUCCEEDED

    @property
    def cut(self) -> bool:
        """Whether the token limit stopped the answer (each provider's word for it)."""
        from llm_kit.providers import cut_finish_reasons

        return self.finish_reason in cut_finish_reasons()

    def invalid_reason(
        self, error: str, max_tokens: int | None = None, setting: str = "max_tokens"
    ) -> str:
        """Why a succeeded answer is no value of its JSON schema (``error``: the parse's own
        reason): a cut answer says so, as a live run does, naming the provider config's
        ``setting`` and its value ``max_tokens`` when known."""
        if not self.cut:
            return error
        from llm_kit.answers import truncated_error

        return truncated_error(self.finish_reason, max_tokens, setting)

    def reason(self) -> str:
        """One sentence for the row's ``__errors__``."""
        if self.state == RUNNING:
            return "pending: its batch is still running; rerun merge later or use --wait"
        return f"{self.state}: {self.message}" if self.message else self.state


def failure_state(kind: str | None) -> str:
    """A result's ``error_kind`` (provider words vary) → failed, expired, canceled or missing."""
    word = (kind or "").strip().lower()
    if "expire" in word:
        return EXPIRED
    if "cancel" in word:
        return CANCELED
    if word in (MISSING, "not_found", "no_result"):
        return MISSING
    return FAILED


def usage_count(value: Any) -> int | None:
    """A token count as the provider reported it, or None when absent or not a number."""
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def result_line(batch_no: int, row: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """An adapter's result row (see ``adapter.py``) as a ``results`` line; ``None`` without id."""
    custom_id = row.get("custom_id")
    if not custom_id:
        return None
    status = str(row.get("status") or "succeeded").lower()
    text = row.get("generated_text")
    ok = status not in ("error", "errored", "failed") and text is not None
    retryable = row.get("retryable")
    return (
        *split_id(str(custom_id)),
        batch_no,
        int(ok),
        None if text is None else mend_text(str(text)),  # a plugin's lone surrogate
        None if ok else str(row.get("error_kind") or "errored"),
        None if ok else str(row.get("error_message") or "the provider returned no text"),
        None if retryable is None else int(bool(retryable)),
        usage_count(row.get("input_tokens")),
        usage_count(row.get("output_tokens")),
        None if row.get("finish_reason") is None else str(row["finish_reason"]),
    )
