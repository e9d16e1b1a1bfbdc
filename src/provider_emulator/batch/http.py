"""HTTP plumbing the batch routes share: auth and stats around a handler, bodies streamed to
disk or read under a size cap, files served from disk, timestamps, pages of a list."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import orjson
from aiohttp import web

from provider_emulator.batch.damaged_downloads import DamagedDownloads
from provider_emulator.errors import RequestError
from provider_emulator.family import Family, Handler

T = TypeVar("T")

CHUNK = 1 << 20  # bytes read from a request body at a time


def guarded(family: Family, handler: Handler, *, keyed: bool = True) -> Handler:
    """``handler`` behind the family's key check (unless not ``keyed``), its RequestError
    rendered, its answer counted."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        stats = family.state.stats
        stats.arrived()
        response: web.StreamResponse | None = family.authenticate(request) if keyed else None
        if response is None:
            try:
                response = await handler(request)
            except RequestError as error:
                response = family.request_error(error)
        stats.answered(family.name, response.status)
        return response

    return wrapped


def origin(request: web.Request) -> str:
    """``http://host:port`` as the client reached us: for absolute URLs in answers."""
    return str(request.url.origin())


async def read_json(request: web.Request, limit: int, too_large: str) -> tuple[Any, int]:
    """The JSON body and its size, read in chunks and refused with 413 past ``limit`` bytes.

    Reads past aiohttp's client_max_size on purpose: batch bodies may be 256 MB.
    """
    body = bytearray()
    async for chunk in request.content.iter_chunked(CHUNK):
        body += chunk
        if len(body) > limit:
            raise RequestError(too_large, status=413)
    try:
        return orjson.loads(body), len(body)
    except orjson.JSONDecodeError:
        raise RequestError("The request body is not valid JSON.") from None


async def save_stream(
    chunks: AsyncIterable[bytes], path: Path, *, append: bool = False, limit: int | None = None
) -> int:
    """Write ``chunks`` to ``path``; the bytes written. Past ``limit`` bytes: a 400."""
    written = 0
    with path.open("ab" if append else "wb") as out:
        async for chunk in chunks:
            written += len(chunk)
            if limit is not None and written > limit:
                raise RequestError(f"The file is larger than the limit of {limit} bytes.")
            out.write(chunk)
    return written


def file_response(path: Path, content_type: str = "application/octet-stream") -> web.FileResponse:
    """The file streamed from disk (sendfile where the loop has it), never read whole."""
    return web.FileResponse(path, chunk_size=CHUNK, headers={"Content-Type": content_type})


def result_file_response(downloads: DamagedDownloads, path: Path) -> web.StreamResponse:
    """A batch result file, or the damaged copy ``downloads`` says to serve this time."""
    body = downloads.take(path)
    if body is None:
        return file_response(path)
    return web.Response(body=body, headers={"Content-Type": "application/octet-stream"})


def rfc3339(moment: float) -> str:
    """``2024-08-20T18:37:24.100435Z``: how Anthropic and Google write times."""
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RequestError(f"{name} must be an integer, got {raw!r}.", param=name) from None
    if not low <= value <= high:
        raise RequestError(f"{name} must be between {low} and {high}.", param=name)
    return value


def page_after(
    items: Sequence[T], key: Callable[[T], str], after: str | None, limit: int
) -> tuple[list[T], bool]:
    """The ``limit`` items that follow the one whose key is ``after`` (all when None)."""
    start = 0
    if after:
        keys = [key(item) for item in items]
        if after not in keys:
            raise RequestError(f"No such object: {after!r}.", status=404)
        start = keys.index(after) + 1
    page = list(items[start : start + limit])
    return page, start + limit < len(items)
