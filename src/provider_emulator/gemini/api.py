"""Gemini's live wire format: POST /v1beta/models/{model}:generateContent (and /v1/...).

The API takes camelCase or snake_case field names and always answers in camelCase.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from provider_emulator.errors import RequestError
from provider_emulator.family import JSON_HEADERS, Family, Handler, json_response
from provider_emulator.faults import Fault
from provider_emulator.limits import BudgetState
from provider_emulator.responder import Prompt, Reply

_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    529: "UNAVAILABLE",
}
_NO_KEY = (
    "Method doesn't allow unregistered callers (callers without established identity). "
    "Please use API Key or other form of API consumer identity to call this API."
)
_FAULTS: dict[Fault, tuple[int, str]] = {
    Fault.SERVER_ERROR: (500, "An internal error has occurred. Please retry."),
    Fault.UNAVAILABLE: (503, "The model is overloaded. Please try again later."),
    Fault.OVERLOADED: (529, "The model is overloaded. Please try again later."),
}
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def get_field(data: dict[str, Any], camel: str, snake: str) -> Any:
    """A field under its camelCase or its snake_case name (the API takes both)."""
    value = data.get(camel)
    return data.get(snake) if value is None else value


def _proto_duration(seconds: float) -> str:
    """google.protobuf.Duration in JSON: ``34s``, ``1.5s``."""
    return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"


class GeminiFamily(Family):
    name = "gemini"

    def _error(
        self,
        status: int,
        message: str,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        error: dict[str, Any] = {"code": status, "message": message, "status": _STATUS[status]}
        if details:
            error["details"] = details
        return json_response({"error": error}, status, {**JSON_HEADERS, **(headers or {})})

    def authenticate(self, request: web.Request) -> web.Response | None:
        if request.headers.get("x-goog-api-key", "").strip() or request.query.get("key"):
            return None
        return self._error(403, _NO_KEY)

    def parse(self, body: dict[str, Any], request: web.Request) -> Prompt:
        model, _, action = request.match_info["model_action"].partition(":")
        if action != "generateContent":
            raise RequestError(
                f"Method {action or '(none)'} is not found for models/{model}.", status=404
            )
        return self.parse_body(body, model)

    def parse_body(self, body: dict[str, Any], model: str) -> Prompt:
        """A GenerateContentRequest → Prompt (live requests and batch items alike)."""
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise RequestError("* GenerateContentRequest.contents: contents is not specified")
        config = get_field(body, "generationConfig", "generation_config") or {}
        prompt = Prompt(
            model,
            [],
            get_field(config, "maxOutputTokens", "max_output_tokens"),
            config.get("temperature"),
        )
        chars = 0
        system = get_field(body, "systemInstruction", "system_instruction")
        if system:
            text = self._text_of(system, prompt)
            chars += len(text)
            prompt.messages.append({"role": "system", "content": text})
        for content in contents:
            if not isinstance(content, dict):
                raise RequestError("* GenerateContentRequest.contents: invalid content")
            text = self._text_of(content, prompt)
            chars += len(text)
            role = "assistant" if content.get("role") == "model" else "user"
            prompt.messages.append({"role": role, "content": text})
        prompt.chars = chars
        self._structured(config, prompt)
        return prompt

    @staticmethod
    def _text_of(content: Any, prompt: Prompt) -> str:
        if isinstance(content, str):
            return content
        parts = content.get("parts") if isinstance(content, dict) else None
        if not isinstance(parts, list):
            raise RequestError("* GenerateContentRequest.contents.parts: parts is not specified")
        texts = []
        for part in parts:
            if not isinstance(part, dict):
                continue
            if "text" in part:
                texts.append(str(part["text"]))
            elif get_field(part, "inlineData", "inline_data") or get_field(
                part, "fileData", "file_data"
            ):
                prompt.images += 1
        return "\n".join(texts)

    @staticmethod
    def _structured(config: dict[str, Any], prompt: Prompt) -> None:
        schema = get_field(config, "responseJsonSchema", "response_json_schema")
        if schema is None:
            schema = get_field(config, "responseSchema", "response_schema")
        if isinstance(schema, dict):
            prompt.schema = schema
        elif get_field(config, "responseMimeType", "response_mime_type") == "application/json":
            prompt.json_mode = True

    def render(self, prompt: Prompt, reply: Reply) -> dict[str, Any]:
        return {
            "candidates": [
                {
                    "content": {"parts": [{"text": reply.text}], "role": "model"},
                    "finishReason": "MAX_TOKENS" if reply.truncated else "STOP",
                    "index": 0,
                }
            ],
            "usageMetadata": {
                "promptTokenCount": reply.input_tokens,
                "candidatesTokenCount": reply.output_tokens,
                "totalTokenCount": reply.input_tokens + reply.output_tokens,
                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": reply.input_tokens}],
            },
            "modelVersion": prompt.model,
            "responseId": self.state.new_id(),
        }

    def request_error(self, error: RequestError) -> web.Response:
        return self._error(error.status if error.status in _STATUS else 400, error.message)

    def limit_headers(self, budget: BudgetState) -> dict[str, str]:
        return {}  # Gemini reports its budget only in 429 bodies

    def budget_refusal(self, budget: BudgetState) -> web.Response:
        per_minute = "Requests" if budget.refused_by == "requests" else "InputTokens"
        return self._exhausted(
            f"You exceeded your current quota (emulator): {budget.refused_by} per minute.",
            f"Generate{per_minute}PerMinutePerProjectPerModel",
            budget.retry_after_s,
        )

    def _exhausted(self, message: str, quota_id: str, retry_s: float | None) -> web.Response:
        details: list[dict[str, Any]] = [
            {"@type": _QUOTA_FAILURE, "violations": [{"quotaId": quota_id}]}
        ]
        if retry_s is not None:
            details.append({"@type": _RETRY_INFO, "retryDelay": _proto_duration(retry_s)})
        return self._error(429, message, details)

    def sporadic_refusal(self, budget_headers: Mapping[str, str]) -> web.Response:
        # Gemini names the spent quota in the body (QuotaFailure): a sporadic 429 names none.
        retry = {
            "@type": _RETRY_INFO,
            "retryDelay": _proto_duration(self.state.config.faults.retry_after_s),
        }
        return self._error(429, "Resource has been exhausted (injected by the emulator).", [retry])

    def fault_response(self, fault: Fault) -> web.Response:
        if fault is Fault.RATE_LIMIT:
            return self._exhausted(
                "Resource has been exhausted (injected by the emulator).",
                "GenerateRequestsPerMinutePerProjectPerModel",
                self.state.config.faults.retry_after_s,
            )
        if fault is Fault.INSUFFICIENT_QUOTA:
            # A spent daily quota: no RetryInfo, and clients should not retry soon.
            return self._exhausted(
                "You exceeded your current quota, please check your plan and billing details.",
                "GenerateRequestsPerDayPerProjectPerModel",
                None,
            )
        status, message = _FAULTS[fault]
        return self._error(status, message)


def add_routes(
    app: web.Application, family: GeminiFamily, actions: Mapping[str, Handler] | None = None
) -> None:
    """POST /{v1beta,v1}/models/{model}:{action}: generateContent, plus ``actions`` (batches).

    One path segment holds "{model}:{action}", so one route serves every action; an unknown one
    reaches ``family.handle``, which answers Gemini's 404. google-genai 3.x calls /v1 by
    default, older SDKs and the docs /v1beta: both are served.
    """
    handler: Handler = family.handle
    if actions:
        table = dict(actions)

        async def dispatch(request: web.Request) -> web.StreamResponse:
            action = request.match_info["model_action"].rpartition(":")[2]
            return await table.get(action, family.handle)(request)

        handler = dispatch
    for version in ("v1beta", "v1"):
        app.router.add_post(f"/{version}/models/{{model_action}}", handler)
