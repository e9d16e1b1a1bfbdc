"""OpenAI Chat Completions, and every OpenAI-compatible server (vLLM, SGLang, llama.cpp...)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from llm_kit.dialects import NATIVE
from llm_kit.providers.base import Codec, Completion, RateLimitInfo, int_header, parse_duration
from llm_kit.providers.openai_batch import OpenAIBatchBackend
from llm_kit.providers.registry import ProviderSpec, register_provider
from llm_kit.schema import ResponseSchema
from llm_kit.types import ImagePart, Message, TextPart, Usage

# OpenAI's reasoning models (o1, o3, o4-mini, gpt-5...) refuse `max_tokens` with a 400 and want
# `max_completion_tokens` (which the others take too, but not every compatible server does).
_COMPLETION_TOKENS_MODELS = re.compile(r"^(o\d+(-|$)|gpt-5)")


def token_limit_field(model: str) -> str:
    """The body field that caps the answer's tokens for ``model``."""
    return "max_completion_tokens" if _COMPLETION_TOKENS_MODELS.match(model) else "max_tokens"


class OpenAICodec(Codec):
    name = "openai"
    default_base_url = "https://api.openai.com/v1"
    speaks_dialects = True
    cut_reasons = frozenset({"length"})

    def path(self, model: str) -> str:
        return "/chat/completions"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {api_key}"}

    def encode(
        self,
        model: str,
        messages: Sequence[Message],
        sampling: Mapping[str, Any],
        schema: ResponseSchema | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": [_message(m) for m in messages]}
        # Our sampling names are OpenAI's; extra keys pass through to the body as they are.
        limit_field = token_limit_field(model)
        for key, value in sampling.items():
            if value is not None:
                body[limit_field if key == "max_tokens" else key] = value
        if schema is not None:
            # Batch files and OpenAI itself; other servers' forms: llm_kit.dialects.
            NATIVE.apply(body, schema)
        return body

    def decode(self, body: Any) -> Completion:
        choice = body["choices"][0]
        message = choice.get("message") or {}
        usage = body.get("usage") or {}
        return Completion(
            text=message.get("content"),
            usage=Usage(usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0),
            finish_reason=choice.get("finish_reason"),
            refusal=message.get("refusal"),
            cut=choice.get("finish_reason") in self.cut_reasons,
        )

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        if (
            "x-ratelimit-limit-requests" not in headers
            and "x-ratelimit-limit-tokens" not in headers
        ):
            return None
        return RateLimitInfo(
            limit_requests=int_header(headers, "x-ratelimit-limit-requests"),
            remaining_requests=int_header(headers, "x-ratelimit-remaining-requests"),
            reset_requests=parse_duration(headers.get("x-ratelimit-reset-requests")),
            limit_tokens=int_header(headers, "x-ratelimit-limit-tokens"),
            remaining_tokens=int_header(headers, "x-ratelimit-remaining-tokens"),
            reset_tokens=parse_duration(headers.get("x-ratelimit-reset-tokens")),
        )


def _message(message: Message) -> dict[str, Any]:
    parts = message.content
    # A text-only message stays a plain string: the most widely supported shape across servers.
    if len(parts) == 1 and isinstance(parts[0], TextPart):
        return {"role": message.role, "content": parts[0].text}
    content: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            content.append({"type": "text", "text": part.text})
        elif isinstance(part, ImagePart):
            image: dict[str, Any] = {"url": part.resolved_url()}
            if part.detail:
                image["detail"] = part.detail
            content.append({"type": "image_url", "image_url": image})
    return {"role": message.role, "content": content}


OPENAI = register_provider(
    ProviderSpec(
        name="openai",
        codec=OpenAICodec,
        key_env=("OPENAI_API_KEY",),
        batch_backend=OpenAIBatchBackend,
    )
)
