"""Anthropic's live wire format: POST /v1/messages (text, images, forced tool_use, JSON)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from provider_emulator.errors import RequestError
from provider_emulator.family import (
    JSON_HEADERS,
    Family,
    json_response,
    retry_headers,
)
from provider_emulator.faults import Fault
from provider_emulator.limits import BudgetState, rfc3339_in
from provider_emulator.responder import Prompt, Reply

MODELS = ("claude-sonnet-4-6", "claude-haiku-4-5", "claude-opus-4-6")
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")

# Injected failures: (status, error type, message, retryable).
_FAULTS: dict[Fault, tuple[int, str, str, bool]] = {
    Fault.RATE_LIMIT: (
        429,
        "rate_limit_error",
        "Rate limit exceeded (injected by the emulator).",
        True,
    ),
    Fault.INSUFFICIENT_QUOTA: (
        429,
        "rate_limit_error",
        "You have reached your specified API usage limits.",
        False,
    ),
    Fault.SERVER_ERROR: (500, "api_error", "Internal server error", True),
    Fault.UNAVAILABLE: (503, "api_error", "Service unavailable", True),
    Fault.OVERLOADED: (529, "overloaded_error", "Overloaded", True),
}


class AnthropicFamily(Family):
    name = "anthropic"

    def _error(
        self, status: int, type_: str, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        request_id = "req_" + self.state.new_id()
        body = {
            "type": "error",
            "error": {"type": type_, "message": message},
            "request_id": request_id,
        }
        return json_response(
            body, status, {**JSON_HEADERS, "request-id": request_id, **(headers or {})}
        )

    def authenticate(self, request: web.Request) -> web.Response | None:
        # Newer SDKs send the key as a bearer token; older ones (and the docs) as x-api-key.
        headers = request.headers
        if headers.get("x-api-key", "").strip():
            return None
        auth = headers.get("Authorization", "")
        if auth[:7].lower() == "bearer " and auth[7:].strip():
            return None
        return self._error(401, "authentication_error", "x-api-key header is required")

    def parse(self, body: dict[str, Any], request: web.Request) -> Prompt:
        if "anthropic-version" not in request.headers:
            raise RequestError("anthropic-version: header is required")
        return self.parse_body(body)

    def parse_body(self, body: dict[str, Any]) -> Prompt:
        """A Messages body → Prompt (live requests and batch ``params`` alike)."""
        for field in ("model", "max_tokens", "messages"):
            if body.get(field) is None:
                raise RequestError(f"{field}: Field required")
        if body.get("stream"):
            raise RequestError("stream: the emulator does not stream; send stream=false")
        max_tokens = body["max_tokens"]
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise RequestError("max_tokens: Input should be a valid integer greater than 0")
        if body.get("temperature") is not None and body.get("top_p") is not None:
            # As the API answers for current models (Claude 4.5 and later).
            raise RequestError(
                "`temperature` and `top_p` cannot both be specified for this model. "
                "Please use only one."
            )
        raw = body["messages"]
        if not isinstance(raw, list) or not raw:
            raise RequestError("messages: at least one message is required")
        prompt = Prompt(str(body["model"]), [], max_tokens, body.get("temperature"))
        chars = 0
        system = body.get("system")
        if system:
            text = self._text_of(system, prompt, "system")
            chars += len(text)
            prompt.messages.append({"role": "system", "content": text})
        for i, message in enumerate(raw):
            role = message.get("role") if isinstance(message, dict) else None
            if role not in ("user", "assistant"):
                raise RequestError(f"messages.{i}.role: Input should be 'user' or 'assistant'")
            text = self._text_of(message.get("content"), prompt, f"messages.{i}.content")
            chars += len(text)
            prompt.messages.append({"role": role, "content": text})
        prompt.chars = chars
        self._structured(body, prompt)
        return prompt

    @staticmethod
    def _text_of(content: Any, prompt: Prompt, where: str) -> str:
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise RequestError(f"{where}: Input should be a valid list")
        texts = []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "image":
                _check_image(block.get("source"), f"{where}.{j}.image.source")
                prompt.images += 1
            elif kind == "tool_result":
                inner = block.get("content")
                if inner:
                    texts.append(AnthropicFamily._text_of(inner, prompt, f"{where}.{j}.content"))
            elif kind is None:
                raise RequestError(f"{where}.{j}.type: Field required")
        return "\n".join(texts)

    @staticmethod
    def _structured(body: dict[str, Any], prompt: Prompt) -> None:
        """JSON through ``output_config.format`` (or the older ``output_format``), or a tool."""
        output_config = body.get("output_config")
        fmt = output_config.get("format") if isinstance(output_config, dict) else None
        fmt = fmt or body.get("output_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            if not isinstance(fmt.get("schema"), dict):
                raise RequestError("output_config.format.schema: Field required")
            prompt.schema = fmt["schema"]
        choice = body.get("tool_choice")
        if not isinstance(choice, dict) or choice.get("type") not in ("tool", "any"):
            return
        tools = [t for t in body.get("tools") or () if isinstance(t, dict)]
        if choice["type"] == "tool":
            tool = next((t for t in tools if t.get("name") == choice.get("name")), None)
            if tool is None:
                raise RequestError(f"tool_choice: no tool named {choice.get('name')!r} in tools")
        elif tools:
            tool = tools[0]
        else:
            raise RequestError("tool_choice: 'any' requires at least one tool")
        schema = tool.get("input_schema")
        prompt.schema = schema if isinstance(schema, dict) else {"type": "object"}
        prompt.tool = str(tool.get("name"))

    def render(self, prompt: Prompt, reply: Reply, *, tier: str = "standard") -> dict[str, Any]:
        ident = self.state.new_id()
        content: list[dict[str, Any]]
        if prompt.tool is not None:
            value = reply.value if isinstance(reply.value, dict) else {}
            content = [
                {"type": "tool_use", "id": "toolu_" + ident, "name": prompt.tool, "input": value}
            ]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": reply.text}]
            stop = "max_tokens" if reply.truncated else "end_turn"
        return {
            "id": "msg_" + ident,
            "type": "message",
            "role": "assistant",
            "model": prompt.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {
                "input_tokens": reply.input_tokens,
                "output_tokens": reply.output_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                "server_tool_use": None,
                "service_tier": tier,
            },
        }

    def request_error(self, error: RequestError) -> web.Response:
        kind = {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}.get(
            error.status, "invalid_request_error"
        )
        return self._error(error.status, kind, error.message)

    def limit_headers(self, budget: BudgetState) -> dict[str, str]:
        headers: dict[str, str] = {}
        if budget.request_limit is not None:
            headers["anthropic-ratelimit-requests-limit"] = str(budget.request_limit)
            headers["anthropic-ratelimit-requests-remaining"] = str(budget.requests_left)
            headers["anthropic-ratelimit-requests-reset"] = rfc3339_in(budget.requests_reset_s)
        if budget.token_limit is not None:
            headers["anthropic-ratelimit-tokens-limit"] = str(budget.token_limit)
            headers["anthropic-ratelimit-tokens-remaining"] = str(budget.tokens_left)
            headers["anthropic-ratelimit-tokens-reset"] = rfc3339_in(budget.tokens_reset_s)
        return headers

    def budget_refusal(self, budget: BudgetState) -> web.Response:
        # Anthropic's own 429 carries only the whole-second retry-after.
        wait = retry_headers(budget.retry_after_s)
        headers = {
            **self.limit_headers(budget),
            "retry-after": wait["retry-after"],
            "x-should-retry": "true",
        }
        message = (
            f"This request would exceed the rate limit for your organization of "
            f"{budget.request_limit if budget.refused_by == 'requests' else budget.token_limit} "
            f"{budget.refused_by} per minute (emulator)."
        )
        return self._error(429, "rate_limit_error", message, headers)

    def fault_response(self, fault: Fault) -> web.Response:
        status, type_, message, retryable = _FAULTS[fault]
        headers = {"x-should-retry": "true" if retryable else "false"}
        if fault is Fault.RATE_LIMIT:
            headers.update(retry_headers(self.state.config.faults.retry_after_s))
        return self._error(status, type_, message, headers)


def _check_image(source: Any, where: str) -> None:
    if not isinstance(source, dict):
        raise RequestError(f"{where}: Field required")
    kind = source.get("type")
    if kind == "base64":
        if source.get("media_type") not in _IMAGE_TYPES:
            raise RequestError(
                f"{where}.base64.media_type: Input should be 'image/jpeg', 'image/png', "
                "'image/gif' or 'image/webp'"
            )
        if not source.get("data"):
            raise RequestError(f"{where}.base64.data: Field required")
    elif kind == "url":
        if not str(source.get("url", "")).startswith(("http://", "https://")):
            raise RequestError(f"{where}.url.url: must be an http(s) URL")
    elif kind != "file":
        raise RequestError(f"{where}.type: Input should be 'base64', 'url' or 'file'")


def add_routes(app: web.Application, family: AnthropicFamily) -> None:
    app.router.add_post("/v1/messages", family.handle)
