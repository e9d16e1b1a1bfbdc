"""GET /v1/models[/{id}]: one path, two providers, told apart by their headers."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from provider_emulator.anthropic import api as anthropic_api
from provider_emulator.family import json_response
from provider_emulator.openai import api as openai_api


def _openai_model(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 1715367049, "owned_by": "system"}


def _anthropic_model(model_id: str) -> dict[str, Any]:
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": "2025-09-29T00:00:00Z",
    }


def _is_anthropic(request: web.Request) -> bool:
    # Anthropic clients always send anthropic-version; a bare x-api-key is Anthropic's too.
    headers = request.headers
    return "anthropic-version" in headers or (
        "x-api-key" in headers and "Authorization" not in headers
    )


def add_routes(
    app: web.Application,
    openai: openai_api.OpenAIFamily,
    anthropic: anthropic_api.AnthropicFamily,
) -> None:
    stats = openai.state.stats

    def answer(request: web.Request, openai_body: Any, anthropic_body: Any) -> web.Response:
        family = anthropic if _is_anthropic(request) else openai
        body = anthropic_body if family is anthropic else openai_body
        response = family.authenticate(request) or json_response(body)
        stats.count(family.name, response.status)
        return response

    async def list_models(request: web.Request) -> web.Response:
        claude = [_anthropic_model(m) for m in anthropic_api.MODELS]
        return answer(
            request,
            {"object": "list", "data": [_openai_model(m) for m in openai_api.MODELS]},
            {
                "data": claude,
                "has_more": False,
                "first_id": claude[0]["id"],
                "last_id": claude[-1]["id"],
            },
        )

    async def get_model(request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        return answer(request, _openai_model(model_id), _anthropic_model(model_id))

    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model_id}", get_model)
