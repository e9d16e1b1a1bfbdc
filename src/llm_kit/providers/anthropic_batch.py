"""Anthropic Message Batches: inline requests, results as JSONL with four result types."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from llm_kit import provider_json
from llm_kit.providers.batch_backend import (
    BatchBackend,
    BatchLimits,
    Chunk,
    Outcome,
    decode_lines,
    parse_rfc3339,
)
from llm_kit.providers.batch_types import BatchCounts, JobState, ProviderBatch

_STATES = {"in_progress": JobState.IN_PROGRESS, "canceling": JobState.CANCELING}
# Errors worth another try; an invalid_request_error must be fixed first.
_NOT_RETRYABLE = frozenset({"invalid_request_error", "authentication_error", "permission_error"})


class AnthropicBatchBackend(BatchBackend):
    name = "anthropic"
    endpoint = "/v1/messages"
    # custom_ids are manifest positions ("0", "1", ...): always legal for ^[a-zA-Z0-9_-]{1,64}$.
    limits = BatchLimits(max_requests=100_000, max_bytes=256 * 1024 * 1024)
    # A message batch has no metadata and no name: llm_kit.batch.orphans finds one by its
    # creation time, size and results instead.
    tags_batches = False

    def frame(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id, "params": body}

    async def submit(self, chunk: Chunk) -> tuple[ProviderBatch, dict[str, Any]]:
        _, created = await self.call(
            "POST",
            "/v1/messages/batches",
            data=_request_body(chunk.path),
            timeout=self.transfer_timeout,
            what="creating a message batch",
        )
        batch = chunk.batch(created["id"])
        self.apply(batch, created)
        return batch, created

    async def listed(self, since: float) -> AsyncIterator[tuple[ProviderBatch, Mapping[str, Any]]]:
        params = {"limit": "100"}
        while True:
            _, page = await self.call(
                "GET", "/v1/messages/batches", params=params, what="listing message batches"
            )
            entries = page.get("data") or []
            for data in entries:
                if parse_rfc3339(str(data.get("created_at") or "")) < since:
                    return  # newest first: the rest is older still
                batch = ProviderBatch(id=str(data["id"]), first=0, count=0)
                self.apply(batch, data)
                yield batch, data
            if not page.get("has_more") or not entries:
                return
            params = {"limit": "100", "after_id": str(page.get("last_id") or entries[-1]["id"])}

    async def refresh(self, batch: ProviderBatch) -> dict[str, Any]:
        _, data = await self.call(
            "GET", f"/v1/messages/batches/{batch.id}", what=f"message batch {batch.id}"
        )
        self.apply(batch, data)
        return data

    async def cancel(self, batch: ProviderBatch) -> dict[str, Any]:
        _, data = await self.call(
            "POST", f"/v1/messages/batches/{batch.id}/cancel", what=f"cancelling {batch.id}"
        )
        self.apply(batch, data)
        return data

    def state_of(self, data: Mapping[str, Any]) -> JobState | None:
        status = str(data.get("processing_status", ""))
        if status != "ended":
            return _STATES.get(status)
        # "ended" says nothing of how: read it from the counts.
        c = _counts(data, 0)
        if c.canceled:
            return JobState.CANCELED
        if c.expired:
            return JobState.EXPIRED
        if c.errored and not c.succeeded:
            return JobState.FAILED
        return JobState.COMPLETED

    def answered(self, data: Mapping[str, Any]) -> int | None:
        counts = _counts(data, 0)
        return counts.succeeded + counts.errored

    def apply(self, batch: ProviderBatch, data: Mapping[str, Any]) -> None:
        batch.counts = _counts(data, batch.count)
        batch.results_url = data.get("results_url")
        batch.provider_status = data.get("processing_status")
        batch.state = self.state_of(data) or JobState.PENDING

    async def results(self, batch: ProviderBatch, workdir: Path) -> AsyncIterator[Outcome]:
        url = batch.results_url or f"/v1/messages/batches/{batch.id}/results"
        lines = await self.download_lines(
            url, workdir / f"{batch.id}.jsonl", what=f"the results of {batch.id}"
        )
        for outcome in decode_lines(
            lines, self._decode, f"the results of {batch.id}", self.http.secrets
        ):
            yield outcome

    def _decode(self, line: bytes) -> Outcome:
        record = provider_json.loads(line)
        custom_id = str(record["custom_id"])
        result = record.get("result") or {}
        kind = result.get("type")
        if kind == "succeeded":
            return Outcome(custom_id, completion=self.codec.decode(result["message"]))
        if kind == "errored":
            error = (result.get("error") or {}).get("error") or {}
            error_type = str(error.get("type") or "api_error")
            return Outcome(
                custom_id,
                error=f"anthropic: {error_type}: {error.get('message') or 'no message'}",
                kind=error_type,
                retryable=error_type not in _NOT_RETRYABLE,
            )
        label = "canceled" if kind == "canceled" else "expired"
        return Outcome(
            custom_id, error=f"the request was {label} before it ran", kind=label, retryable=True
        )


def _counts(data: Mapping[str, Any], count: int) -> BatchCounts:
    """The batch's request counts; their sum is the batch's size (the provider keeps it so),
    which also tells the size of a batch known only by its id."""
    counts = data.get("request_counts") or {}
    values = {
        key: int(counts.get(key) or 0)
        for key in ("succeeded", "errored", "expired", "canceled", "processing")
    }
    return BatchCounts(total=sum(values.values()) or count, **values)


async def _request_body(path: Path) -> AsyncIterator[bytes]:
    """{"requests": [line, line, ...]} streamed from the spool file (it may be 256 MB)."""
    yield b'{"requests":['
    separator = b""
    with open(path, "rb") as f:
        while True:
            # About a megabyte at a time: one write per line would cost more than the JSON.
            lines = f.readlines(1 << 20)
            if not lines:
                break
            yield separator + b",".join(line.rstrip(b"\n") for line in lines)
            separator = b","
    yield b"]}"
