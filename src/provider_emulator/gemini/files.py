"""Gemini Files: the resumable upload, GET/DELETE /{v}/files/{id}, GET /{v}/files, and the
download of generated files (GET [/download]/{v}/files/{id}:download?alt=media).

The upload protocol: POST /upload/{v}/files with ``X-Goog-Upload-Command: start`` answers an
``x-goog-upload-url``; the bytes then go there in one or more POSTs (``upload`` with the running
``X-Goog-Upload-Offset``, the last one ``upload, finalize``), each streamed to disk. The SDK
sends 8 MB chunks; simple clients send everything with ``upload, finalize`` at offset 0.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from provider_emulator.batch.http import (
    CHUNK,
    file_response,
    origin,
    page_after,
    query_int,
    result_file_response,
    rfc3339,
    save_stream,
)
from provider_emulator.batch.store import StoredFile
from provider_emulator.errors import RequestError
from provider_emulator.family import json_response
from provider_emulator.gemini.api import GeminiFamily

PREFIX = "files/"
MAX_FILE_BYTES = 2 * 1024**3
TTL_S = 48 * 3600
CHUNK_GRANULARITY = 8 * 1024**2
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")


@dataclass(slots=True)
class _Upload:
    """A resumable upload between its start and its finalize."""

    path: Path
    name: str
    display_name: str
    mime_type: str
    expected: int | None
    received: int = 0


def file_json(file: StoredFile, base_url: str, version: str) -> dict[str, Any]:
    data = {
        "name": file.id,
        "displayName": file.name,
        "mimeType": file.mime_type,
        "sizeBytes": str(file.size),
        "createTime": rfc3339(file.created_at),
        "updateTime": rfc3339(file.created_at),
        "expirationTime": rfc3339(file.created_at + TTL_S),
        "uri": f"{base_url}/{version}/{file.id}",
        "state": "ACTIVE",
        "source": file.purpose,
    }
    if file.purpose == "GENERATED":
        data["downloadUri"] = f"{base_url}/download/{version}/{file.id}:download?alt=media"
    return data


def _commands(request: web.Request) -> set[str]:
    raw = request.headers.get("X-Goog-Upload-Command", "")
    return {part.strip().lower() for part in raw.split(",") if part.strip()}


class GeminiFiles:
    def __init__(self, family: GeminiFamily) -> None:
        self.family = family
        self.state = family.state
        self.store = family.state.batches
        self._uploads: dict[str, _Upload] = {}

    def get(self, file_ref: str) -> StoredFile:
        file_id = PREFIX + file_ref
        file = self.store.files.get(file_id)
        if file is None:
            raise RequestError(f"File {file_id} not found.", status=404)
        return file

    # -- upload ------------------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        commands = _commands(request)
        if "start" in commands:
            return self.family.authenticate(request) or await self._start(request)
        upload_id = request.query.get("upload_id", "")
        upload = self._uploads.get(upload_id)
        if upload is None:
            raise RequestError(f"No upload session {upload_id!r}.", status=404)
        if "query" in commands:
            return _upload_status("active", {"X-Goog-Upload-Size-Received": str(upload.received)})
        if "upload" not in commands:
            raise RequestError("X-Goog-Upload-Command must be 'upload' or 'upload, finalize'.")
        offset = request.headers.get("X-Goog-Upload-Offset", "0")
        if offset != str(upload.received):
            raise RequestError(
                f"X-Goog-Upload-Offset is {offset}; the upload has {upload.received} bytes."
            )
        try:
            upload.received += await save_stream(
                request.content.iter_chunked(CHUNK),
                upload.path,
                append=True,
                limit=MAX_FILE_BYTES - upload.received,
            )
        except RequestError:
            self._drop(upload_id)
            raise
        if "finalize" not in commands:
            return _upload_status("active")
        self._uploads.pop(upload_id)
        if upload.expected is not None and upload.received != upload.expected:
            upload.path.unlink(missing_ok=True)
            raise RequestError(
                f"The upload announced {upload.expected} bytes but sent {upload.received}."
            )
        file = StoredFile(
            upload.name,
            upload.path,
            upload.received,
            time.time(),
            upload.display_name,
            "UPLOADED",
            upload.mime_type,
        )
        self.store.add_file(file)
        version = request.match_info["version"]
        body = {"file": file_json(file, origin(request), version)}
        return _upload_status("final", body=body)

    async def _start(self, request: web.Request) -> web.Response:
        if request.headers.get("X-Goog-Upload-Protocol", "").lower() != "resumable":
            raise RequestError("The emulator takes only resumable uploads.")
        raw = await request.read()
        try:
            meta = (orjson.loads(raw) if raw.strip() else {}).get("file") or {}
        except (orjson.JSONDecodeError, AttributeError):
            raise RequestError("The upload start body must be {'file': {...}}.") from None
        expected = _int_header(request, "X-Goog-Upload-Header-Content-Length")
        if expected is not None and expected > MAX_FILE_BYTES:
            raise RequestError(f"Files may hold at most {MAX_FILE_BYTES} bytes.")
        upload_id = self.state.new_id()
        path = self.store.new_path("gemini-upload")
        path.touch()
        self._uploads[upload_id] = _Upload(
            path,
            self._name(meta.get("name")),
            str(meta.get("displayName") or meta.get("display_name") or ""),
            request.headers.get("X-Goog-Upload-Header-Content-Type")
            or str(meta.get("mimeType") or "application/octet-stream"),
            expected,
        )
        version = request.match_info["version"]
        url = f"{origin(request)}/upload/{version}/files?upload_id={upload_id}"
        headers = {
            "x-goog-upload-url": url + "&upload_protocol=resumable",
            "x-goog-upload-chunk-granularity": str(CHUNK_GRANULARITY),
            "x-guploader-uploadid": upload_id,
        }
        return _upload_status("active", headers)

    def _name(self, wanted: Any) -> str:
        if not wanted:
            return PREFIX + self.state.new_id()
        short = str(wanted).removeprefix(PREFIX)
        if not _NAME.fullmatch(short):
            raise RequestError(
                "File names are up to 40 lowercase letters, digits or dashes (not at the start)."
            )
        if PREFIX + short in self.store.files:
            raise RequestError(f"File {PREFIX + short} already exists.", status=409)
        return PREFIX + short

    def _drop(self, upload_id: str) -> None:
        upload = self._uploads.pop(upload_id, None)
        if upload is not None:
            upload.path.unlink(missing_ok=True)

    # -- the files -----------------------------------------------------------------------------

    async def retrieve(self, request: web.Request) -> web.StreamResponse:
        file_ref = request.match_info["file_id"]
        if file_ref.endswith(":download"):
            return await self.download(request)
        file = self.get(file_ref)
        return json_response(file_json(file, origin(request), request.match_info["version"]))

    async def download(self, request: web.Request) -> web.StreamResponse:
        file_ref = request.match_info["file_id"].removesuffix(":download")
        file = self.get(file_ref)
        if file.purpose == "GENERATED":
            return result_file_response(self.family.state.result_downloads, file.path)
        return file_response(file.path)

    async def delete(self, request: web.Request) -> web.Response:
        file = self.get(request.match_info["file_id"])
        self.store.delete_file(file.id)
        return json_response({})

    async def list(self, request: web.Request) -> web.Response:
        files = [f for f in reversed(self.store.files.values()) if f.id.startswith(PREFIX)]
        size = query_int(request, "pageSize", 10, 1, 100)
        page, more = page_after(files, lambda f: f.id, request.query.get("pageToken"), size)
        version = request.match_info["version"]
        data: dict[str, Any] = {"files": [file_json(f, origin(request), version) for f in page]}
        if more:
            data["nextPageToken"] = page[-1].id
        return json_response(data)


def _upload_status(
    status: str, headers: dict[str, str] | None = None, body: Any = None
) -> web.Response:
    all_headers = {"x-goog-upload-status": status, **(headers or {})}
    if body is None:
        return web.Response(status=200, headers=all_headers)
    all_headers["Content-Type"] = "application/json"
    return web.Response(body=orjson.dumps(body), headers=all_headers)


def _int_header(request: web.Request, name: str) -> int | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise RequestError(f"{name} must be a whole number of bytes.") from None
