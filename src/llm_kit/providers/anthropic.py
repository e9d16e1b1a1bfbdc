"""Anthropic Messages API."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from llm_kit.errors import ImageTypeError
from llm_kit.images import describe_image, is_data_url, split_data_url
from llm_kit.providers.anthropic_batch import AnthropicBatchBackend
from llm_kit.providers.base import Codec, Completion, RateLimitInfo, int_header
from llm_kit.providers.registry import ProviderSpec, register_provider
from llm_kit.schema import ResponseSchema
from llm_kit.types import ImagePart, Message, TextPart, Usage

IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
DEFAULT_MAX_TOKENS = 1024  # Anthropic requires max_tokens; this is what we send when none is set.
_RENAMED = {"stop": "stop_sequences"}
_UNSUPPORTED = frozenset({"seed"})


class AnthropicCodec(Codec):
    name = "anthropic"
    default_base_url = "https://api.anthropic.com"
    cut_reasons = frozenset({"max_tokens", "model_context_window_exceeded"})

    def path(self, model: str) -> str:
        return "/v1/messages"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-api-key": api_key, "anthropic-version": "2023-06-01"}

    def encode(
        self,
        model: str,
        messages: Sequence[Message],
        sampling: Mapping[str, Any],
        schema: ResponseSchema | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": DEFAULT_MAX_TOKENS,
            "messages": [_message(m) for m in messages if m.role != "system"],
        }
        if len(body["messages"]) != len(messages):
            body["system"] = "\n\n".join(m.text for m in messages if m.role == "system")
        for key, value in sampling.items():
            if value is None or key in _UNSUPPORTED:
                continue
            if key == "stop" and isinstance(value, str):
                value = [value]
            body[_RENAMED.get(key, key)] = value
        if schema is not None:
            body["output_config"] = {"format": {"type": "json_schema", "schema": schema.schema}}
        return body

    def decode(self, body: Any) -> Completion:
        text_blocks = [
            b.get("text", "") for b in body.get("content", ()) if b.get("type") == "text"
        ]
        usage = body.get("usage") or {}
        stop = body.get("stop_reason")
        return Completion(
            text="".join(text_blocks) if text_blocks else None,
            usage=Usage(usage.get("input_tokens") or 0, usage.get("output_tokens") or 0),
            finish_reason=stop,
            refusal="the model refused to answer" if stop == "refusal" else None,
            cut=stop in self.cut_reasons,
        )

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        if "anthropic-ratelimit-requests-limit" not in headers:
            return None
        return RateLimitInfo(
            limit_requests=int_header(headers, "anthropic-ratelimit-requests-limit"),
            remaining_requests=int_header(headers, "anthropic-ratelimit-requests-remaining"),
            reset_requests=_seconds_until(headers.get("anthropic-ratelimit-requests-reset")),
            limit_tokens=int_header(headers, "anthropic-ratelimit-tokens-limit"),
            remaining_tokens=int_header(headers, "anthropic-ratelimit-tokens-remaining"),
            reset_tokens=_seconds_until(headers.get("anthropic-ratelimit-tokens-reset")),
        )


def _seconds_until(rfc3339: str | None) -> float | None:
    if not rfc3339:
        return None
    try:
        when = datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    except ValueError:
        return None
    return max(0.0, when.timestamp() - time.time())


def _message(message: Message) -> dict[str, Any]:
    parts = message.content
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return {"role": message.role, "content": parts[0].text}
    content: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            content.append({"type": "image", "source": image_source(part)})
    return {"role": message.role, "content": content}


def image_source(part: ImagePart) -> dict[str, Any]:
    """An Anthropic image source; only jpeg, png, gif and webp are accepted by the API."""
    url = part.resolved_url()
    if not is_data_url(url):
        return {"type": "url", "url": url}
    media_type, data = split_data_url(url)
    if media_type not in IMAGE_TYPES:
        raise ImageTypeError(
            f"Anthropic accepts only JPEG, PNG, GIF and WebP images; {describe_image(part.url)} "
            f"is {media_type}: convert it first",
            media_type=media_type,
        )
    return {"type": "base64", "media_type": media_type, "data": data}


ANTHROPIC = register_provider(
    ProviderSpec(
        name="anthropic",
        codec=AnthropicCodec,
        key_env=("ANTHROPIC_API_KEY",),
        batch_backend=AnthropicBatchBackend,
    )
)
