"""Which key the OpenAI endpoint accepts, and how it refuses another one.

Without ``EmulatorConfig.api_key`` any non-empty bearer token passes (the family's own check).
With it, only that key does, and a missing or different one is refused as ``refuse_keys_as``
says: ``provider``, OpenAI's 401; ``litellm``, as a LiteLLM proxy without a database answers
(no key: HTTP 500 in plain text; a key that is not its master key: HTTP 400 "No connected
db."), the gateway answers that name the key without a 401.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from provider_emulator.config import EmulatorConfig
from provider_emulator.family import json_response

_MISSING = "missing"
_WRONG = "wrong"
_OPENAI_NO_KEY = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header "
    "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


def _openai(problem: str, key: str) -> web.Response:
    if problem == _MISSING:
        message = _OPENAI_NO_KEY
    else:  # OpenAI quotes the start and the end of the key it refused, never the whole
        message = f"Incorrect API key provided: {key[:3]}{'*' * max(0, len(key) - 7)}{key[-4:]}."
    code = "invalid_api_key" if problem == _WRONG else None
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return json_response({"error": error}, 401)


def _litellm(problem: str, key: str) -> web.Response:
    if problem == _MISSING:
        return web.Response(
            status=500,
            text="Authentication Error, No api key passed in.",
            content_type="text/plain",
        )
    error: dict[str, Any] = {
        "message": "No connected db.",
        "type": "no_db_connection",
        "param": "None",
        "code": "400",
    }
    return json_response({"error": error}, 400)


# How each kind of server refuses a key: by EmulatorConfig.refuse_keys_as.
_REFUSALS = {"provider": _openai, "litellm": _litellm}


def bearer_token(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    return auth[7:].strip() if auth[:7].lower() == "bearer " else ""


def key_refusal(request: web.Request, config: EmulatorConfig) -> web.Response | None:
    """The refusal of a request without the one key ``config`` accepts, else None."""
    key = bearer_token(request)
    if config.api_key is None:
        return None if key else _REFUSALS[config.refuse_keys_as](_MISSING, key)
    if key == config.api_key:
        return None
    return _REFUSALS[config.refuse_keys_as](_WRONG if key else _MISSING, key)


__all__ = ["bearer_token", "key_refusal"]
