"""Google Gemini generateContent (Developer API)."""

from __future__ import annotations

import mimetypes
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from llm_kit.errors import ProviderError
from llm_kit.images import is_data_url, split_data_url
from llm_kit.providers.base import Codec, Completion, RateLimitInfo, parse_duration
from llm_kit.providers.gemini_batch import GeminiBatchBackend
from llm_kit.providers.registry import ProviderSpec, register_provider
from llm_kit.schema import ResponseSchema
from llm_kit.types import ImagePart, Message, TextPart, Usage

_GENERATION_KEYS = {
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "max_tokens": "maxOutputTokens",
    "max_completion_tokens": "maxOutputTokens",
    "seed": "seed",
    "stop": "stopSequences",
}


class GeminiCodec(Codec):
    name = "gemini"
    default_base_url = "https://generativelanguage.googleapis.com"
    cut_reasons = frozenset({"MAX_TOKENS"})

    def path(self, model: str) -> str:
        model = model.removeprefix("models/")
        return f"/v1beta/models/{model}:generateContent"

    def auth_headers(self, api_key: str) -> dict[str, str]:
        return {"x-goog-api-key": api_key}

    def encode(
        self,
        model: str,
        messages: Sequence[Message],
        sampling: Mapping[str, Any],
        schema: ResponseSchema | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"contents": [_content(m) for m in messages if m.role != "system"]}
        system = "\n\n".join(m.text for m in messages if m.role == "system")
        if system:
            body["systemInstruction"] = {"parts": [{"text": system}]}
        config: dict[str, Any] = {}
        for key, value in sampling.items():
            if value is None:
                continue
            if key == "stop" and isinstance(value, str):
                value = [value]
            # Unknown keys go into generationConfig too: that is where Gemini's knobs live.
            config[_GENERATION_KEYS.get(key, key)] = value
        if schema is not None:
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = schema.schema
        if config:
            body["generationConfig"] = config
        return body

    def decode(self, body: Any) -> Completion:
        usage = body.get("usageMetadata") or {}
        output_tokens = (usage.get("candidatesTokenCount") or 0) + (
            usage.get("thoughtsTokenCount") or 0
        )
        tokens = Usage(usage.get("promptTokenCount") or 0, output_tokens)
        candidates = body.get("candidates") or []
        if not candidates:
            reason = (body.get("promptFeedback") or {}).get("blockReason", "no candidates")
            raise ProviderError(
                f"gemini blocked the prompt ({reason})", kind="blocked", retryable=False
            )
        candidate = candidates[0]
        parts = (candidate.get("content") or {}).get("parts") or []
        texts = [p["text"] for p in parts if "text" in p and not p.get("thought")]
        finish_reason = candidate.get("finishReason")
        return Completion(
            text="".join(texts) if texts else None,
            usage=tokens,
            finish_reason=finish_reason,
            cut=finish_reason in self.cut_reasons,
        )

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimitInfo | None:
        return None  # Gemini reports limits only through 429 bodies.

    def error(self, status: int, headers: Mapping[str, str], body: bytes) -> ProviderError:
        error = super().error(status, headers, body)
        try:
            details = orjson.loads(body)["error"].get("details") or []
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            return error
        for detail in details:
            kind = str(detail.get("@type", ""))
            if kind.endswith("RetryInfo") and error.retry_after is None:
                error.retry_after = parse_duration(detail.get("retryDelay"))
            if kind.endswith("QuotaFailure"):
                # Gemini's 429 names the quota it spent (it sends no rate-limit headers).
                error.budget_spent = error.status == 429
                quota_ids = [str(v.get("quotaId", "")) for v in detail.get("violations", [])]
                if any("PerDay" in q for q in quota_ids):
                    # The daily quota is spent: retrying within minutes cannot succeed.
                    error.retryable = False
                    error.kind = "daily_quota_exhausted"
        return error


def _content(message: Message) -> dict[str, Any]:
    role = "model" if message.role == "assistant" else "user"
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append({"text": part.text})
        elif isinstance(part, ImagePart):
            url = part.resolved_url()
            if is_data_url(url):
                media_type, data = split_data_url(url)
                parts.append({"inlineData": {"mimeType": media_type, "data": data}})
            else:
                media_type = mimetypes.guess_type(url)[0] or "image/jpeg"
                parts.append({"fileData": {"mimeType": media_type, "fileUri": url}})
    return {"role": role, "parts": parts}


GEMINI = register_provider(
    ProviderSpec(
        name="gemini",
        codec=GeminiCodec,
        key_env=("GEMINI_API_KEY", "GOOGLE_API_KEY"),
        batch_backend=GeminiBatchBackend,
    )
)
