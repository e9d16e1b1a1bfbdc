"""Anthropic Message Batches: inline requests, results as JSONL with four result types."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from llm_kit.batch.backend import BatchBackend, BatchLimits, Chunk, Outcome, decode_lines
from llm_kit.batch.job import BatchCounts, JobState, ProviderBatch

_STATES = {"in_progress": JobState.IN_PROGRESS, "canceling": JobState.CANCELING}
# Errors worth another try; an invalid_request_error must be fixed first.
_NOT_RETRYABLE = frozenset({"invalid_request_error", "authentication_error", "permission_error"})


class AnthropicBatchBackend(BatchBackend):
    name = "anthropic"
    endpoint = "/v1/messages"
    # custom_ids are manifest positions ("0", "1", ...): always legal for ^[a-zA-Z0-9_-]{1,64}$.
    limits = BatchLimits(max_requests=100_000, max_bytes=256 * 1024 * 1024)

    def line(self, custom_id: str, body: dict[str, Any]) -> bytes:
        return orjson.dumps(
            {"custom_id": custom_id, "params": body}, option=orjson.OPT_APPEND_NEWLINE
        )

    async def create(self, chunk: Chunk) -> ProviderBatch:
        _, created = await self.call(
            "POST",
            "/v1/messages/batches",
            data=_request_body(chunk.path),
            timeout=3600,
            what="creating a message batch",
        )
        batch = chunk.batch(created["id"])
        self._update(batch, created)
        return batch

    async def refresh(self, batch: ProviderBatch) -> None:
        _, data = await self.call(
            "GET", f"/v1/messages/batches/{batch.id}", what=f"message batch {batch.id}"
        )
        self._update(batch, data)

    async def cancel(self, batch: ProviderBatch) -> None:
        _, data = await self.call(
            "POST", f"/v1/messages/batches/{batch.id}/cancel", what=f"cancelling {batch.id}"
        )
        self._update(batch, data)

    def _update(self, batch: ProviderBatch, data: dict[str, Any]) -> None:
        counts = data.get("request_counts") or {}
        batch.counts = BatchCounts(
            total=batch.count,
            succeeded=counts.get("succeeded", 0),
            errored=counts.get("errored", 0),
            expired=counts.get("expired", 0),
            canceled=counts.get("canceled", 0),
            processing=counts.get("processing", 0),
        )
        batch.results_url = data.get("results_url")
        status = data.get("processing_status", "")
        if status != "ended":
            batch.state = _STATES.get(status, JobState.PENDING)
            return
        # "ended" says nothing of how: read it from the counts.
        c = batch.counts
        if c.canceled:
            batch.state = JobState.CANCELED
        elif c.expired:
            batch.state = JobState.EXPIRED
        elif c.errored and not c.succeeded:
            batch.state = JobState.FAILED
        else:
            batch.state = JobState.COMPLETED

    async def results(self, batch: ProviderBatch, workdir: Path) -> AsyncIterator[Outcome]:
        url = batch.results_url or f"/v1/messages/batches/{batch.id}/results"
        lines = await self.download_lines(
            url, workdir / f"{batch.id}.jsonl", what=f"the results of {batch.id}"
        )
        for outcome in decode_lines(lines, self._decode, f"the results of {batch.id}"):
            yield outcome

    def _decode(self, line: bytes) -> Outcome:
        record = orjson.loads(line)
        index = int(record["custom_id"])
        result = record.get("result") or {}
        kind = result.get("type")
        if kind == "succeeded":
            return Outcome(index, completion=self.codec.decode(result["message"]))
        if kind == "errored":
            error = (result.get("error") or {}).get("error") or {}
            error_type = str(error.get("type") or "api_error")
            return Outcome(
                index,
                error=f"anthropic: {error_type}: {error.get('message') or 'no message'}",
                kind=error_type,
                retryable=error_type not in _NOT_RETRYABLE,
            )
        label = "canceled" if kind == "canceled" else "expired"
        return Outcome(
            index, error=f"the request was {label} before it ran", kind=label, retryable=True
        )


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
