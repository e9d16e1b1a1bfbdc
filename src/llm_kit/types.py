"""The values that flow through llm_kit: messages, items, results, usage and configuration."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_kit.errors import ConfigError
from llm_kit.images import resolve_image_url

Role = Literal["system", "user", "assistant"]
_ROLES = ("system", "user", "assistant")


@dataclass(slots=True, frozen=True)
class TextPart:
    """A piece of text in a message's content."""

    text: str
    """The text."""


@dataclass(slots=True, frozen=True)
class ImagePart:
    """An image given as an http(s) URL, a data URL or a local path.

    Local paths are read (and turned into data URLs) only when the request is built, so an
    unreadable file becomes that item's recorded error instead of stopping the batch.
    """

    url: str
    """An http(s) URL (sent as is), a `data:` URL, or a local path (read and encoded when the
    request is built)."""
    detail: str | None = None
    """OpenAI's image detail (`low`, `high`, `auto`); `None` leaves the provider's default."""

    def resolved_url(self) -> str:
        """The URL to send: a local path becomes a `data:` URL.

        Raises:
            ItemError: the file cannot be read or is not an image.
        """
        return resolve_image_url(self.url)


Part = TextPart | ImagePart


@dataclass(slots=True, frozen=True)
class Message:
    """One turn of a conversation: who speaks and what (text and images)."""

    role: Role
    """`system`, `user` or `assistant`."""
    content: tuple[Part, ...]
    """The parts, in order: `TextPart`s and `ImagePart`s."""

    @classmethod
    def user(cls, text: str = "", image_urls: Iterable[str] | None = None) -> Message:
        """A user message: the images first, then the text.

        Args:
            text: the text; may be empty when there are images.
            image_urls: http(s) URLs, data URLs or local paths.

        Raises:
            ConfigError: neither text nor an image was given.
        """
        if not image_urls and text:  # the common case, built by millions: no list
            return cls("user", (TextPart(text),))
        parts: list[Part] = [ImagePart(str(url)) for url in image_urls or ()]
        if text:
            parts.append(TextPart(text))
        if not parts:
            raise ConfigError("Message.user() needs text or at least one image URL")
        return cls("user", tuple(parts))

    @classmethod
    def system(cls, text: str) -> Message:
        """A system message (instructions) of plain text."""
        return cls("system", (TextPart(text),))

    @classmethod
    def assistant(cls, text: str) -> Message:
        """An assistant message of plain text (an earlier answer, or a few-shot example)."""
        return cls("assistant", (TextPart(text),))

    @property
    def text(self) -> str:
        """The text parts joined with newlines (images left out)."""
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))

    @classmethod
    def coerce(cls, value: Any) -> Message:
        """Accept a Message, or an OpenAI-style dict {"role", "content": str | parts}."""
        if isinstance(value, Message):
            return value
        if isinstance(value, Mapping):
            role = value.get("role")
            if role not in _ROLES:
                raise ConfigError(f"message role must be one of {_ROLES}, got {role!r}")
            content = value.get("content")
            if isinstance(content, str):
                return cls(role, (TextPart(content),))
            if isinstance(content, list):
                return cls(role, tuple(_coerce_part(p) for p in content))
            raise ConfigError("message content must be a string or a list of parts")
        raise ConfigError(
            f"a message must be a llm_kit.Message or a dict with 'role' and 'content', "
            f"got {type(value).__name__}"
        )


def _coerce_part(part: Any) -> Part:
    if isinstance(part, TextPart | ImagePart):
        return part
    if isinstance(part, str):
        return TextPart(part)
    if isinstance(part, Mapping):
        if part.get("type") == "text":
            return TextPart(str(part.get("text", "")))
        if part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            detail = image.get("detail") if isinstance(image, Mapping) else None
            if isinstance(url, str):
                return ImagePart(url, detail)
    raise ConfigError(f"unsupported message part {part!r}: use text or image_url parts")


@dataclass(slots=True)
class BatchItem:
    """One request of a batch: an id, the conversation, and optionally a Pydantic schema."""

    id: str
    """Names the item in its result and in a resumed output file; unique within a batch. An
    `int` is turned into a `str`."""
    messages: list[Message]
    """The conversation: `Message`s, or OpenAI-style dicts `{"role", "content"}`."""
    response_model: type[BaseModel] | None = None
    """A Pydantic model the answer must be JSON of; the result's `response` is then an
    instance. `None`: plain text."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Travels to the result untouched; must be JSON-serialisable."""
    sampling: dict[str, Any] | None = None
    """Overrides the client's sampling defaults for this item only (e.g.
    `{"max_tokens": 64}`)."""

    def __post_init__(self) -> None:
        if isinstance(self.id, int) and not isinstance(self.id, bool):
            self.id = str(self.id)
        if not isinstance(self.id, str) or not self.id:
            raise ConfigError(f"BatchItem.id must be a non-empty string, got {self.id!r}")
        messages = self.messages
        if type(messages) is not list:  # the common case costs one check: items come by millions
            raise ConfigError(f"BatchItem {self.id!r}: messages must be a list of messages")
        if not messages:
            raise ConfigError(f"BatchItem {self.id!r}: messages is empty")
        for message in messages:
            if type(message) is not Message:
                self.messages = [Message.coerce(m) for m in messages]
                break
        model = self.response_model
        if model is not None and not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise ConfigError(
                f"BatchItem {self.id!r}: response_model must be a pydantic BaseModel subclass, "
                f"got {model!r}"
            )
        # Both are sent or written as JSON: a value that is not fails here, naming the item,
        # not in the middle of a batch (numpy scalars are sent as numbers).
        for name, value, option in (
            ("metadata", self.metadata, 0),
            ("sampling", self.sampling, orjson.OPT_SERIALIZE_NUMPY),
        ):
            if value:
                try:
                    orjson.dumps(value, option=option)
                except TypeError as exc:
                    raise ConfigError(
                        f"BatchItem {self.id!r}: {name} must be JSON-serialisable ({exc})"
                    ) from None


@dataclass(slots=True)
class Usage:
    """Tokens a request used, as the provider reported them."""

    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Generated tokens."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


@dataclass(slots=True)
class BatchResult:
    """The outcome of one item: ``ok`` with a ``response``, or not ok with an ``error``."""

    id: str
    """The item's id."""
    ok: bool
    """Whether the item succeeded."""
    response: Any = None
    """The text, or the validated `response_model` instance when the item had one (a plain
    dict once read back from JSON). `None` when not ok."""
    error: str | None = None
    """Why the item failed, one sentence; `None` when ok."""
    usage: Usage | None = None
    """Tokens used, all attempts together; `None` when the provider reported none."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """The item's metadata, untouched."""
    error_kind: str | None = None
    """Names the failure: `rate_limit`, `http_400`, `validation` (the answer missed the
    `response_model`, re-asks included), `truncated` (a JSON answer cut at the token limit),
    `refusal`, `invalid_item`, `expired` ..."""
    retryable: bool = False
    """Whether running the item again may succeed (a rate limit, a server error, a timeout);
    never for `validation`, `truncated` or `refusal`: the same request would buy the same
    answer again."""
    attempts: int = 1
    """Requests made for the item (retries included)."""
    finish_reason: str | None = None
    """Why generation stopped, in the provider's words (`stop`, `length`, `end_turn`,
    `max_tokens`, `MAX_TOKENS` ...), on failures that had an answer too; `None` when no answer
    came."""

    def to_dict(self) -> dict[str, Any]:
        """The result as one JSON-ready dict (the line `batch_to_jsonl` writes)."""
        response = self.response
        if isinstance(response, BaseModel):
            response = response.model_dump(mode="json")
        # id, ok and retryable lead: the resume scan reads them without parsing the rest.
        return {
            "id": self.id,
            "ok": self.ok,
            "retryable": self.retryable,
            "response": response,
            "error": self.error,
            "error_kind": self.error_kind,
            "usage": None
            if self.usage is None
            else {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
            },
            "finish_reason": self.finish_reason,
            "attempts": self.attempts,
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchResult:
        """A result from a `to_dict` dict (a line of a results file); `response` stays JSON."""
        usage = data.get("usage")
        return cls(
            id=data["id"],
            ok=bool(data["ok"]),
            response=data.get("response"),
            error=data.get("error"),
            usage=Usage(**usage) if usage else None,
            metadata=data.get("metadata") or {},
            error_kind=data.get("error_kind"),
            retryable=bool(data.get("retryable", False)),
            attempts=int(data.get("attempts", 1)),
            finish_reason=data.get("finish_reason"),
        )


class BatchConfig(BaseModel):
    """How the live pipeline runs. Memory is O(worker_concurrency + input_buffer_size)."""

    # The attribute docstrings below are also the fields' pydantic descriptions.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    worker_concurrency: int = Field(64, ge=1)
    """Requests in flight at once (also the connection pool's size)."""
    input_buffer_size: int = Field(1024, ge=1)
    """Items of an async iterable read ahead of the workers."""
    on_failure: Literal["record", "raise"] = Field("record")
    """`record`: a failed item becomes `BatchResult(error=...)` and the batch goes on;
    `raise`: the first failure stops the batch with `BatchItemFailed`."""
    max_retries: int = Field(6, ge=0)
    """Retries of a retryable failure (rate limit, timeout, 5xx) per item."""
    retry_base_delay: float = Field(0.5, gt=0)
    """The first backoff, in seconds; it grows exponentially with jitter."""
    retry_max_delay: float = Field(60.0, gt=0)
    """The longest backoff or server-requested wait, in seconds; at least `retry_base_delay`."""
    validation_retries: int = Field(2, ge=0)
    """New attempts when the answer fails `response_model` validation."""
    request_timeout: float = Field(120.0, gt=0)
    """Seconds one attempt may take."""
    connect_timeout: float = Field(10.0, gt=0)
    """Seconds to open a connection."""
    rpm: int | None = Field(None, ge=1)
    """Requests per minute budget; `None`: no limit beyond the provider's 429s."""
    tpm: int | None = Field(None, ge=1)
    """Tokens per minute budget (estimated before a request, settled after); `None`: no
    limit."""
    batch_max_requests: int | None = Field(None, ge=1)
    """Provider batch API: requests per batch, at most the provider's cap (`None`: the cap)."""
    batch_max_bytes: int | None = Field(None, ge=1024)
    """Provider batch API: bytes of a batch's uploaded JSONL, at most the provider's cap
    (`None`: the cap)."""

    @model_validator(mode="after")
    def _check_delays(self) -> BatchConfig:
        if self.retry_max_delay < self.retry_base_delay:
            raise ValueError("retry_max_delay must be at least retry_base_delay")
        return self


@dataclass(slots=True)
class Completion:
    """A decoded answer: the text (JSON text when a schema was requested), usage, stop reason."""

    text: str | None
    usage: Usage
    finish_reason: str | None = None
    refusal: str | None = None
    # Whether the token limit stopped the answer: the codec reads it from ``finish_reason``
    # (each provider has its own word for it: ``length``, ``max_tokens``, ``MAX_TOKENS``).
    cut: bool = False


@dataclass(slots=True)
class RateLimitInfo:
    """What a response's rate-limit headers said; None where a header was absent."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests: float | None = None  # seconds until the request budget is full again
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens: float | None = None
