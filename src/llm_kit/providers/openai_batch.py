"""OpenAI Files + Batches (also OpenAI-compatible servers that implement them)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from llm_kit import provider_json
from llm_kit.errors import ConfigError
from llm_kit.providers.base import Codec
from llm_kit.providers.batch_backend import (
    BatchBackend,
    BatchLimits,
    Chunk,
    Outcome,
    counts_from,
    decode_lines,
)
from llm_kit.providers.batch_types import JobState, ProviderBatch
from llm_kit.redact import redact
from llm_kit.transport import HttpTransport

_STATES = {
    "validating": JobState.PENDING,
    "in_progress": JobState.IN_PROGRESS,
    "finalizing": JobState.FINALIZING,
    "cancelling": JobState.CANCELING,
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "expired": JobState.EXPIRED,
    "cancelled": JobState.CANCELED,
}
# Non-HTTP failures in the error file: why the request never ran.
_NOT_RUN = {"batch_expired": "expired", "batch_cancelled": "canceled"}
TAG_KEY = "llm_kit_tag"  # the metadata key that carries Chunk.tag
# OpenAI's limits on a batch's metadata: pairs, characters of a key, of a value.
METADATA_LIMITS = (16, 64, 512)
_PAGE = "100"  # the most a list page may hold


class OpenAIBatchBackend(BatchBackend):
    name = "openai"
    endpoint = "/v1/chat/completions"
    limits = BatchLimits(max_requests=50_000, max_bytes=200 * 1024 * 1024)

    def __init__(
        self,
        codec: Codec,
        http: HttpTransport,
        model: str,
        *,
        endpoint: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """``endpoint`` is the target of every line (and of the batch); ``metadata`` is sent
        on creation, with the batch's tag (so at most 15 pairs of its own)."""
        super().__init__(codec, http, model)
        if endpoint is not None:
            self.endpoint = endpoint
        self.metadata = dict(metadata) if metadata is not None else {"created_by": "llm_kit"}
        _check_metadata(self.metadata)

    def frame(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id, "method": "POST", "url": self.endpoint, "body": body}

    async def submit(self, chunk: Chunk) -> tuple[ProviderBatch, dict[str, Any]]:
        with open(chunk.path, "rb") as f:
            form = aiohttp.FormData()
            form.add_field("purpose", "batch")
            form.add_field("file", f, filename=chunk.path.name, content_type="application/jsonl")
            _, uploaded = await self.call(
                "POST",
                "/files",
                data=form,
                timeout=self.transfer_timeout,
                what=f"the upload of {chunk.path.name}",
                names_a_route=True,  # vLLM, llama.cpp, llama-cpp-python: no /v1/files
            )
        _, created = await self.call(
            "POST",
            "/batches",
            data=orjson.dumps(
                {
                    "input_file_id": uploaded["id"],
                    "endpoint": self.endpoint,
                    "completion_window": "24h",
                    "metadata": _with_tag(self.metadata, chunk.tag),
                }
            ),
            what="creating a batch",
            names_a_route=True,
        )
        batch = chunk.batch(created["id"], input_file_id=uploaded["id"])
        self.apply(batch, created)
        return batch, created

    async def listed(self, since: float) -> AsyncIterator[tuple[ProviderBatch, Mapping[str, Any]]]:
        params = {"limit": _PAGE}
        while True:
            _, page = await self.call("GET", "/batches", params=params, what="listing batches")
            entries = page.get("data") or []
            for data in entries:
                if int(data.get("created_at") or 0) < since:
                    return  # newest first: the rest is older still
                batch = ProviderBatch(id=str(data["id"]), first=0, count=0)
                self.apply(batch, data)
                yield batch, data
            if not page.get("has_more") or not entries:
                return
            params = {"limit": _PAGE, "after": str(page.get("last_id") or entries[-1]["id"])}

    def tag_of(self, data: Mapping[str, Any]) -> str | None:
        tag = (data.get("metadata") or {}).get(TAG_KEY)
        return str(tag) if tag else None

    async def refresh(self, batch: ProviderBatch) -> dict[str, Any]:
        _, data = await self.call("GET", f"/batches/{batch.id}", what=f"batch {batch.id}")
        self.apply(batch, data)
        return data

    async def cancel(self, batch: ProviderBatch) -> dict[str, Any]:
        _, data = await self.call(
            "POST", f"/batches/{batch.id}/cancel", what=f"cancelling batch {batch.id}"
        )
        self.apply(batch, data)
        return data

    def state_of(self, data: Mapping[str, Any]) -> JobState | None:
        return _STATES.get(str(data.get("status", "")))

    def answered(self, data: Mapping[str, Any]) -> int | None:
        counts = data.get("request_counts") or {}
        return int(counts.get("completed") or 0) + int(counts.get("failed") or 0)

    def apply(self, batch: ProviderBatch, data: Mapping[str, Any]) -> None:
        batch.state = self.state_of(data) or JobState.PENDING
        batch.provider_status = data.get("status")
        batch.input_file_id = data.get("input_file_id") or batch.input_file_id
        batch.output_file_id = data.get("output_file_id")
        batch.error_file_id = data.get("error_file_id")
        errors = (data.get("errors") or {}).get("data") or []
        batch.errors = [f"{e.get('code')}: {e.get('message')}" for e in errors]
        counts = data.get("request_counts") or {}
        total = counts.get("total") or batch.count
        batch.counts = counts_from(
            batch.state, total, counts.get("completed", 0), counts.get("failed", 0)
        )
        if batch.state is JobState.FAILED:
            batch.counts.errored, batch.counts.succeeded = total, 0

    async def results(self, batch: ProviderBatch, workdir: Path) -> AsyncIterator[Outcome]:
        for file_id in (batch.output_file_id, batch.error_file_id):
            if not file_id:
                continue
            lines = await self.download_lines(
                f"/files/{file_id}/content", workdir / f"{file_id}.jsonl", what=f"file {file_id}"
            )
            for outcome in decode_lines(lines, self._decode, f"file {file_id}", self.http.secrets):
                yield outcome

    def _decode(self, line: bytes) -> Outcome:
        record = provider_json.loads(line)
        custom_id = str(record["custom_id"])
        response = record.get("response")
        if response and response.get("status_code") == 200:
            return Outcome(custom_id, completion=self.codec.decode(response["body"]))
        if response:
            status = int(response.get("status_code") or 500)
            # Redacted before the codec quotes (and may cut) the body.
            body = redact(response.get("body") or {}, self.http.secrets)
            failure = self.codec.error(status, {}, orjson.dumps(body))
            return Outcome(
                custom_id, error=str(failure), kind=failure.kind, retryable=failure.retryable
            )
        error = record.get("error") or {}
        code = str(error.get("code") or "unknown")
        message = f"{code}: {error.get('message') or 'no message'}"
        return Outcome(custom_id, error=message, kind=_NOT_RUN.get(code, code), retryable=True)


def _check_metadata(metadata: Mapping[str, str]) -> None:
    """A ``ConfigError`` when ``metadata`` and the tag would not fit OpenAI's limits (which
    would refuse every batch, or cut the pairs that finds a batch again after a crash)."""
    pairs, key_chars, value_chars = METADATA_LIMITS
    if TAG_KEY in metadata:
        raise ConfigError(f"batch metadata may not set {TAG_KEY!r}: llm_kit tags each batch")
    if len(metadata) > pairs - 1:
        raise ConfigError(
            f"batch metadata holds {len(metadata)} pairs; OpenAI allows {pairs}, one of them "
            f"llm_kit's tag, so at most {pairs - 1}"
        )
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(f"batch metadata {key!r}: keys and values must be strings")
        if len(key) > key_chars or len(value) > value_chars:
            raise ConfigError(
                f"batch metadata {key!r}: OpenAI allows keys of {key_chars} characters and "
                f"values of {value_chars} at most"
            )


def _with_tag(metadata: Mapping[str, str], tag: str | None) -> dict[str, str]:
    return dict(metadata) if tag is None else {**metadata, TAG_KEY: tag}
