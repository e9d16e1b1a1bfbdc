"""OpenAI's live wire format: POST /v1/chat/completions, GET /v1/models[/{id}]."""

from __future__ import annotations

import re
import time
from typing import Any

from aiohttp import web

from provider_emulator.config import DialectName
from provider_emulator.dialects import apply_structured
from provider_emulator.errors import RequestError
from provider_emulator.family import (
    JSON_HEADERS,
    Family,
    json_response,
    retry_headers,
)
from provider_emulator.faults import Fault
from provider_emulator.keys import key_refusal
from provider_emulator.limits import BudgetState, go_duration
from provider_emulator.responder import Prompt, Reply

MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-5-mini")
_IMAGE_MIME = ("image/png", "image/jpeg", "image/jpg", "image/gif", "image/webp")
# OpenAI's reasoning models refuse max_tokens (llm_kit keeps its own copy of this rule).
_COMPLETION_TOKENS_ONLY = re.compile(r"^(o\d+(-|$)|gpt-5)")
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# Injected failures: (status, message, type, code, retryable).
_FAULTS: dict[Fault, tuple[int, str, str, str | None, bool]] = {
    Fault.RATE_LIMIT: (
        429,
        "Rate limit reached (injected by the emulator).",
        "requests",
        "rate_limit_exceeded",
        True,
    ),
    Fault.INSUFFICIENT_QUOTA: (
        429,
        "You exceeded your current quota, please check your plan and billing details.",
        "insufficient_quota",
        "insufficient_quota",
        False,
    ),
    Fault.SERVER_ERROR: (
        500,
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
        True,
    ),
    Fault.UNAVAILABLE: (
        503,
        "The engine is currently overloaded, please try again later.",
        "server_error",
        None,
        True,
    ),
    Fault.OVERLOADED: (
        529,
        "The server is overloaded, please try again later.",
        "server_error",
        None,
        True,
    ),
}


def error_body(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _text_of(content: Any, prompt: Prompt) -> str:
    """Message content (a string or parts) → its text; images are counted and checked."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise RequestError("Invalid type for 'messages[].content'.", param="messages")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            texts.append(str(part.get("text", "")))
        elif kind == "image_url":
            _check_image(part.get("image_url"))
            prompt.images += 1
        elif kind not in ("input_audio", "file", "refusal"):
            raise RequestError(f"Invalid content part type: {kind!r}.", param="messages")
    return "\n".join(texts)


def _check_image(image: Any) -> None:
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str) or not url:
        raise RequestError(
            "Missing required parameter: 'image_url.url'.",
            param="messages",
            code="missing_required_parameter",
        )
    if url.startswith("data:"):
        mime = url[5:].split(";", 1)[0].lower()
        if mime not in _IMAGE_MIME or ";base64," not in url[:64]:
            raise RequestError(
                "Invalid image data: use a base64 data URL of a png, jpeg, gif or webp image.",
                param="messages",
                code="invalid_image_format",
            )
    elif not url.startswith(("http://", "https://")):
        raise RequestError(
            "Invalid image URL: use an http(s) URL or a base64 data URL.",
            param="messages",
            code="invalid_image_url",
        )


class OpenAIFamily(Family):
    name = "openai"

    def authenticate(self, request: web.Request) -> web.Response | None:
        return key_refusal(request, self.state.config)

    def parse(self, body: dict[str, Any], request: web.Request) -> Prompt:
        config = self.state.config
        dialect = dict(config.model_dialects).get(str(body.get("model")), config.dialect)
        return self.parse_body(body, dialect)

    def parse_body(self, body: dict[str, Any], dialect: DialectName = "openai") -> Prompt:
        """A chat completions body → Prompt (live requests and batch lines alike); ``dialect``
        is the server whose structured-output forms it takes."""
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError("you must provide a model parameter")
        raw = body.get("messages")
        if raw is None:
            raise RequestError(
                "Missing required parameter: 'messages'.",
                param="messages",
                code="missing_required_parameter",
            )
        if not isinstance(raw, list) or not raw:
            raise RequestError(
                "Invalid 'messages': expected a non-empty array.",
                param="messages",
                code="empty_array" if raw == [] else None,
            )
        if body.get("stream"):
            raise RequestError("The emulator does not stream: send stream=false.", param="stream")
        if (
            dialect == "openai"
            and body.get("max_tokens") is not None
            and _COMPLETION_TOKENS_ONLY.match(model)
        ):
            raise RequestError(
                "Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
                param="max_tokens",
                code="unsupported_parameter",
            )
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        prompt = Prompt(model, [], max_tokens, body.get("temperature"))
        chars = 0
        for message in raw:
            if not isinstance(message, dict) or "role" not in message:
                raise RequestError("Each message needs a 'role'.", param="messages")
            text = _text_of(message.get("content"), prompt)
            chars += len(text)
            prompt.messages.append({"role": _ROLES.get(message["role"], "user"), "content": text})
        prompt.chars = chars
        apply_structured(body, prompt, dialect)
        return prompt

    def render(self, prompt: Prompt, reply: Reply) -> dict[str, Any]:
        return {
            "id": "chatcmpl-" + self.state.new_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": prompt.model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": reply.text,
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": None,
                    "finish_reason": "length" if reply.truncated else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": reply.input_tokens,
                "completion_tokens": reply.output_tokens,
                "total_tokens": reply.input_tokens + reply.output_tokens,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0},
            },
            "service_tier": "default",
            "system_fingerprint": "fp_emulator",
        }

    def request_error(self, error: RequestError) -> web.Response:
        body = error_body(
            error.message, error.kind or "invalid_request_error", error.param, error.code
        )
        return json_response(body, error.status)

    def limit_headers(self, budget: BudgetState) -> dict[str, str]:
        headers: dict[str, str] = {}
        if budget.request_limit is not None:
            headers["x-ratelimit-limit-requests"] = str(budget.request_limit)
            headers["x-ratelimit-remaining-requests"] = str(budget.requests_left)
            headers["x-ratelimit-reset-requests"] = go_duration(budget.requests_reset_s)
        if budget.token_limit is not None:
            headers["x-ratelimit-limit-tokens"] = str(budget.token_limit)
            headers["x-ratelimit-remaining-tokens"] = str(budget.tokens_left)
            headers["x-ratelimit-reset-tokens"] = go_duration(budget.tokens_reset_s)
        return headers

    def budget_refusal(self, budget: BudgetState) -> web.Response:
        wait = budget.retry_after_s
        per_minute = (
            "requests per min (RPM)"
            if budget.refused_by == "requests"
            else ("tokens per min (TPM)")
        )
        message = f"Rate limit reached on {per_minute} (emulator). Please try again in {wait:.3f}s."
        headers = {**JSON_HEADERS, **self.limit_headers(budget), **retry_headers(wait)}
        body = error_body(message, budget.refused_by, None, "rate_limit_exceeded")
        return json_response(body, 429, headers)

    def fault_response(self, fault: Fault) -> web.Response:
        status, message, type_, code, retryable = _FAULTS[fault]
        headers = {**JSON_HEADERS, "x-should-retry": "true" if retryable else "false"}
        if fault is Fault.RATE_LIMIT:
            headers.update(retry_headers(self.state.config.faults.retry_after_s))
        return json_response(error_body(message, type_, None, code), status, headers)


def add_routes(app: web.Application, family: OpenAIFamily) -> None:
    app.router.add_post("/v1/chat/completions", family.handle)
