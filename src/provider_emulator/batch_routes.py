"""Every batch route of the three providers, on one app.

OpenAI and Gemini share paths: google-genai 3.x calls /v1/files/{id} and /v1/batches/{id}, as
OpenAI's SDK does. The caller's key tells them apart: Gemini sends ``x-goog-api-key`` (or
``?key=``), OpenAI a bearer token. Each handler sits behind its family's key check, and every
answer is counted in the stats.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from provider_emulator.anthropic.api import AnthropicFamily
from provider_emulator.anthropic.batch import AnthropicBatches
from provider_emulator.batch.http import guarded
from provider_emulator.dialects import SERVER_DIALECTS
from provider_emulator.family import Family, Handler
from provider_emulator.gemini.api import GeminiFamily
from provider_emulator.gemini.batch import GeminiBatches
from provider_emulator.gemini.files import GeminiFiles
from provider_emulator.openai.api import OpenAIFamily
from provider_emulator.openai.batch import OpenAIBatches
from provider_emulator.openai.files import OpenAIFiles

_GEMINI_VERSIONS = "{version:v1beta|v1}"


def is_gemini(request: web.Request) -> bool:
    return "x-goog-api-key" in request.headers or "key" in request.query


def answered_late(family: Family, create: Handler) -> Handler:
    """A creation handler whose answer leaves ``batch_create_delay_s`` after the job exists:
    a client stopped meanwhile has a batch at the provider that it never heard of."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        response = await create(request)
        delay = family.state.config.batch_create_delay_s
        if delay and response.status < 400:
            await asyncio.sleep(delay)
        return response

    return wrapped


async def _not_found(request: web.Request) -> web.StreamResponse:
    return web.json_response({"detail": "Not Found"}, status=404)  # FastAPI's, as they answer


def _either(openai: Handler | None, gemini: Handler | None) -> Handler:
    if openai is None or gemini is None:
        handler = openai or gemini
        assert handler is not None
        return handler

    async def dispatch(request: web.Request) -> web.StreamResponse:
        return await (gemini if is_gemini(request) else openai)(request)

    return dispatch


def add_routes(
    app: web.Application,
    openai: OpenAIFamily,
    anthropic: AnthropicFamily,
    gemini: GeminiFamily,
) -> dict[str, Handler]:
    """Add the routes; returns the Gemini model actions (``batchGenerateContent``), which
    share the ``models/{model}:{action}`` route of ``gemini_api``."""
    openai_files, openai_batches = OpenAIFiles(openai), OpenAIBatches(openai)
    gemini_files, gemini_batches = GeminiFiles(gemini), GeminiBatches(gemini)

    def o(handler: Handler) -> Handler:
        if not SERVER_DIALECTS[openai.state.config.dialect].batch_api:
            return _not_found  # vLLM, llama.cpp, llama-cpp-python: no files, no batches
        return guarded(openai, handler)

    def g(handler: Handler) -> Handler:
        return guarded(gemini, handler)

    def a(handler: Handler) -> Handler:
        return guarded(anthropic, handler)

    # (method, path under /v1 or /v1beta, OpenAI handler, Gemini handler)
    shared: list[tuple[str, str, Handler | None, Handler | None]] = [
        ("POST", "/files", o(openai_files.create), None),
        ("GET", "/files", o(openai_files.list), g(gemini_files.list)),
        ("GET", "/files/{file_id}", o(openai_files.retrieve), g(gemini_files.retrieve)),
        ("DELETE", "/files/{file_id}", o(openai_files.delete), g(gemini_files.delete)),
        ("GET", "/files/{file_id}/content", o(openai_files.content), None),
        ("POST", "/batches", o(answered_late(openai, openai_batches.create)), None),
        ("GET", "/batches", o(openai_batches.list), g(gemini_batches.list)),
        ("GET", "/batches/{batch_id}", o(openai_batches.retrieve), g(gemini_batches.retrieve)),
        ("POST", "/batches/{batch_id}/cancel", o(openai_batches.cancel), None),
        ("POST", "/batches/{batch_id}", None, g(gemini_batches.post)),  # {id}:cancel
        ("DELETE", "/batches/{batch_id}", None, g(gemini_batches.delete)),
    ]
    router = app.router
    for method, path, openai_handler, gemini_handler in shared:
        router.add_route(method, "/{version:v1}" + path, _either(openai_handler, gemini_handler))
        if gemini_handler is not None:
            router.add_route(method, "/{version:v1beta}" + path, gemini_handler)

    # The upload session's id is the credential of its chunks: they carry no key.
    upload = guarded(gemini, gemini_files.upload, keyed=False)
    router.add_post(f"/upload/{_GEMINI_VERSIONS}/files", upload)
    router.add_get(f"/download/{_GEMINI_VERSIONS}/files/{{file_id}}", g(gemini_files.download))

    anthropic_batches = AnthropicBatches(anthropic)
    base = "/v1/messages/batches"
    router.add_post(base, a(answered_late(anthropic, anthropic_batches.create)))
    router.add_get(base, a(anthropic_batches.list))
    router.add_get(base + "/{batch_id}", a(anthropic_batches.retrieve))
    router.add_delete(base + "/{batch_id}", a(anthropic_batches.delete))
    router.add_post(base + "/{batch_id}/cancel", a(anthropic_batches.cancel))
    router.add_get(base + "/{batch_id}/results", a(anthropic_batches.results))

    return {"batchGenerateContent": g(answered_late(gemini, gemini_batches.create))}
