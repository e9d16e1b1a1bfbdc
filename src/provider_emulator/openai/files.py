"""OpenAI Files: POST/GET /v1/files, GET/DELETE /v1/files/{id}, GET /v1/files/{id}/content.

Uploads are streamed from the multipart body to disk; contents are streamed back from disk.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import BodyPartReader, web

from provider_emulator.batch.http import (
    CHUNK,
    file_response,
    page_after,
    query_int,
    result_file_response,
    save_stream,
)
from provider_emulator.batch.store import StoredFile
from provider_emulator.errors import RequestError
from provider_emulator.family import json_response
from provider_emulator.openai.api import OpenAIFamily

PURPOSES = (
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
)
MAX_FILE_BYTES = 512 * 1024**2  # OpenAI's limit for any file; batch inputs are checked later
BATCH_FILE_TTL_S = 30 * 24 * 3600
ID_PREFIX = "file-"


def file_json(file: StoredFile) -> dict[str, Any]:
    expires = file.created_at + BATCH_FILE_TTL_S if file.purpose.startswith("batch") else None
    return {
        "id": file.id,
        "object": "file",
        "bytes": file.size,
        "created_at": int(file.created_at),
        "expires_at": None if expires is None else int(expires),
        "filename": file.name,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
    }


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(CHUNK):
        yield chunk


class OpenAIFiles:
    def __init__(self, family: OpenAIFamily) -> None:
        self.family = family
        self.store = family.state.batches

    def get(self, request: web.Request) -> StoredFile:
        file_id = request.match_info["file_id"]
        file = self.store.files.get(file_id)
        if file is None or not file_id.startswith(ID_PREFIX):
            raise RequestError(f"No such File object: {file_id}", status=404, param="id")
        return file

    async def create(self, request: web.Request) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            raise RequestError("Uploads must be sent as multipart/form-data.")
        purpose: str | None = None
        upload: StoredFile | None = None
        try:
            async for part in await request.multipart():
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "purpose":
                    purpose = (await part.text()).strip()
                elif part.name == "file":
                    path = self.store.new_path("openai-upload.jsonl")
                    upload = StoredFile(
                        ID_PREFIX + self.family.state.new_id(),
                        path,
                        0,
                        time.time(),
                        part.filename or "upload.jsonl",
                        "",
                    )
                    upload.size = await save_stream(_chunks(part), path, limit=MAX_FILE_BYTES)
            if purpose not in PURPOSES:
                raise RequestError(
                    f"Invalid value for 'purpose': {purpose!r}; use one of {', '.join(PURPOSES)}.",
                    param="purpose",
                )
            if upload is None:
                raise RequestError(
                    "Missing required parameter: 'file'.",
                    param="file",
                    code="missing_required_parameter",
                )
        except BaseException:
            if upload is not None:
                upload.path.unlink(missing_ok=True)
            raise
        upload.purpose = purpose
        return json_response(file_json(self.store.add_file(upload)))

    async def retrieve(self, request: web.Request) -> web.Response:
        return json_response(file_json(self.get(request)))

    async def content(self, request: web.Request) -> web.StreamResponse:
        file = self.get(request)
        if file.purpose == "batch_output":
            return result_file_response(self.family.state.result_downloads, file.path)
        return file_response(file.path)

    async def delete(self, request: web.Request) -> web.Response:
        file = self.get(request)
        self.store.delete_file(file.id)
        return json_response({"id": file.id, "object": "file", "deleted": True})

    async def list(self, request: web.Request) -> web.Response:
        purpose = request.query.get("purpose")
        files = [
            f
            for f in self.store.files.values()
            if f.id.startswith(ID_PREFIX) and (not purpose or f.purpose == purpose)
        ]
        if request.query.get("order", "desc") != "asc":
            files.reverse()
        limit = query_int(request, "limit", 10_000, 1, 10_000)
        page, more = page_after(files, lambda f: f.id, request.query.get("after"), limit)
        return json_response(
            {
                "object": "list",
                "data": [file_json(f) for f in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": more,
            }
        )
