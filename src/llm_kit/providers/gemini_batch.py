"""Gemini Batch Mode (Developer API): inline requests for small jobs, an uploaded file for large."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from llm_kit import provider_json
from llm_kit.errors import ProviderError
from llm_kit.providers.batch_backend import (
    BatchBackend,
    BatchLimits,
    Chunk,
    Outcome,
    decode_lines,
    parse_rfc3339,
)
from llm_kit.providers.batch_types import BatchCounts, JobState, ProviderBatch

# An inline job's whole request body must stay under 20 MB (else its requests are uploaded as
# a file). Its framing differs from the spooled lines', so the body itself is measured.
INLINE_MAX_BYTES = 20 * 1000 * 1000
_STATES = {
    "PENDING": JobState.PENDING,
    "QUEUED": JobState.PENDING,  # Vertex only
    "CANCELLING": JobState.CANCELING,  # Vertex only
    "RUNNING": JobState.IN_PROGRESS,
    "SUCCEEDED": JobState.COMPLETED,
    "FAILED": JobState.FAILED,
    "CANCELLED": JobState.CANCELED,
    "EXPIRED": JobState.EXPIRED,
}
_INVALID_ARGUMENT = 3  # google.rpc.Code: the request itself is wrong, retrying cannot help
_PAGE = "100"


class GeminiBatchBackend(BatchBackend):
    name = "gemini"
    endpoint = "generateContent"
    limits = BatchLimits(max_requests=None, max_bytes=2 * 1024 * 1024 * 1024)
    inline_max_bytes = INLINE_MAX_BYTES

    def frame(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"key": custom_id, "request": body}

    async def submit(self, chunk: Chunk) -> tuple[ProviderBatch, dict[str, Any]]:
        model = self.model.removeprefix("models/")
        # The display name carries the tag: the one label a Gemini batch has room for.
        name = chunk.tag or f"llm_kit-{chunk.path.stem}"
        body = self._inline_body(chunk, name)
        if body is None:
            source = {"fileName": await self._upload(chunk.path)}
            body = orjson.dumps({"batch": {"displayName": name, "inputConfig": source}})
        _, created = await self.call(
            "POST",
            f"/v1beta/models/{model}:batchGenerateContent",
            data=body,
            timeout=self.transfer_timeout,
            what="creating a Gemini batch",
        )
        batch = chunk.batch(created["name"])
        self.apply(batch, created)
        return batch, created

    def _inline_body(self, chunk: Chunk, name: str) -> bytes | None:
        """The creation body with the requests inline, or ``None`` when it would not fit."""
        if chunk.bytes >= self.inline_max_bytes:  # the framing only adds to it
            return None
        requests = []
        with open(chunk.path, "rb") as f:
            for line in f:
                record = orjson.loads(line)
                requests.append({"request": record["request"], "metadata": {"key": record["key"]}})
        source = {"requests": {"requests": requests}}
        body = orjson.dumps({"batch": {"displayName": name, "inputConfig": source}})
        return body if len(body) < self.inline_max_bytes else None

    async def _upload(self, path: Path) -> str:
        """The resumable upload protocol: start, then upload and finalize in one request."""
        size = path.stat().st_size
        headers, _ = await self.call(
            "POST",
            "/upload/v1beta/files",
            data=orjson.dumps({"file": {"displayName": path.name}}),
            headers={
                "X-Goog-Upload-Protocol": "resumable",
                "X-Goog-Upload-Command": "start",
                "X-Goog-Upload-Header-Content-Length": str(size),
                "X-Goog-Upload-Header-Content-Type": "application/jsonl",
            },
            what=f"starting the upload of {path.name}",
        )
        upload_url = headers.get("x-goog-upload-url")
        if not upload_url:
            raise ProviderError("gemini did not return an upload URL", retryable=True)
        with open(path, "rb") as f:
            _, uploaded = await self.call(
                "POST",
                upload_url,
                data=f,
                headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "0"},
                timeout=self.transfer_timeout,
                what=f"the upload of {path.name}",
            )
        return str(uploaded["file"]["name"])

    async def listed(self, since: float) -> AsyncIterator[tuple[ProviderBatch, Mapping[str, Any]]]:
        params = {"pageSize": _PAGE}
        while True:
            _, page = await self.call(
                "GET", "/v1beta/batches", params=params, what="listing batches"
            )
            operations = page.get("operations") or []
            for data in operations:
                created = (data.get("metadata") or {}).get("createTime")
                if created and parse_rfc3339(str(created)) < since:
                    return  # newest first: the rest is older still
                batch = ProviderBatch(id=str(data["name"]), first=0, count=0)
                self.apply(batch, data)
                yield batch, data
            token = page.get("nextPageToken")
            if not token or not operations:
                return
            params = {"pageSize": _PAGE, "pageToken": str(token)}

    def tag_of(self, data: Mapping[str, Any]) -> str | None:
        name = (data.get("metadata") or {}).get("displayName")
        return str(name) if name else None

    async def refresh(self, batch: ProviderBatch) -> dict[str, Any]:
        _, data = await self.call("GET", f"/v1beta/{batch.id}", what=f"Gemini {batch.id}")
        self.apply(batch, data)
        return data

    async def cancel(self, batch: ProviderBatch) -> dict[str, Any]:
        await self.call("POST", f"/v1beta/{batch.id}:cancel", what=f"cancelling {batch.id}")
        return await self.refresh(batch)

    def state_of(self, data: Mapping[str, Any]) -> JobState | None:
        # JOB_STATE_* (the SDK's names) and BATCH_STATE_* (REST) share their suffixes.
        return _STATES.get(_state_word(data).rsplit("_", 1)[-1])

    def answered(self, data: Mapping[str, Any]) -> int | None:
        stats = (data.get("metadata") or data).get("batchStats") or {}
        done = int(stats.get("successfulRequestCount") or 0)
        return done + int(stats.get("failedRequestCount") or 0)

    def apply(self, batch: ProviderBatch, data: Mapping[str, Any]) -> None:
        meta = data.get("metadata") or data
        batch.state = self.state_of(data) or JobState.PENDING
        batch.provider_status = _state_word(data) or None
        stats = meta.get("batchStats") or {}
        done = int(stats.get("successfulRequestCount") or 0)
        failed = int(stats.get("failedRequestCount") or 0)
        pending = int(stats.get("pendingRequestCount") or 0)
        # requestCount tells the size of a batch known only by its id.
        total = int(stats.get("requestCount") or 0) or batch.count
        batch.counts = BatchCounts(total=total, succeeded=done, errored=failed)
        rest = max(0, total - done - failed)
        if batch.state is JobState.EXPIRED:
            batch.counts.expired = rest
        elif batch.state is JobState.CANCELED:
            batch.counts.canceled = rest
        elif batch.state is JobState.FAILED:
            batch.counts.errored += rest
        else:
            batch.counts.processing = pending or rest
        error = data.get("error")
        if error:
            batch.errors = [f"{error.get('code')}: {error.get('message')}"]
        output = data.get("response") or meta.get("output") or {}
        batch.output_file_id = output.get("responsesFile")

    async def results(self, batch: ProviderBatch, workdir: Path) -> AsyncIterator[Outcome]:
        if batch.output_file_id:
            file_id = batch.output_file_id.removeprefix("files/")
            lines = await self.download_lines(
                f"/download/v1beta/files/{file_id}:download?alt=media",
                workdir / f"{file_id}.jsonl",
                what=f"the results of {batch.id}",
            )
            for outcome in decode_lines(
                lines, self._decode_line, f"the results of {batch.id}", self.http.secrets
            ):
                yield outcome
            return
        _, data = await self.call("GET", f"/v1beta/{batch.id}", what=f"Gemini {batch.id}")
        output = data.get("response") or (data.get("metadata") or {}).get("output") or {}
        inlined = (output.get("inlinedResponses") or {}).get("inlinedResponses") or []
        for outcome in decode_lines(
            iter(inlined), self._decode_inline, f"Gemini {batch.id}", self.http.secrets
        ):
            yield outcome

    def _decode_line(self, line: bytes) -> Outcome:
        record = provider_json.loads(line)
        return self._decode(record.get("key"), record)

    def _decode_inline(self, record: Any) -> Outcome:
        return self._decode((record.get("metadata") or {}).get("key"), record)

    def _decode(self, key: Any, record: dict[str, Any]) -> Outcome:
        if key is None:
            raise KeyError("key")  # a line without its key cannot be matched to a request
        custom_id = str(key)
        if record.get("response") is not None:
            try:
                return Outcome(custom_id, completion=self.codec.decode(record["response"]))
            except ProviderError as exc:  # a blocked prompt: no candidates
                return Outcome(custom_id, error=str(exc), kind=exc.kind, retryable=exc.retryable)
        error = record.get("error") or {}
        code = int(error.get("code") or 13)
        return Outcome(
            custom_id,
            error=f"gemini: code {code}: {error.get('message') or 'no message'}",
            kind=f"grpc_{code}",
            retryable=code != _INVALID_ARGUMENT,
        )


def _state_word(data: Mapping[str, Any]) -> str:
    meta = data.get("metadata") or data
    return str(meta.get("state") or "")
