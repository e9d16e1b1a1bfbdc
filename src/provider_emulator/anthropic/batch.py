"""Anthropic Message Batches: /v1/messages/batches[/{id}[/cancel|/results]], list, delete.

The body is checked at once (custom_id pattern and uniqueness, counts, size: a 400 or 413), but
each request's ``params`` only while the batch runs, like the real API: a bad one becomes an
``errored`` result. Results come in a seeded random order.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import orjson
from aiohttp import web

from provider_emulator.anthropic.api import AnthropicFamily
from provider_emulator.batch.http import (
    origin,
    query_int,
    read_json,
    result_file_response,
    rfc3339,
)
from provider_emulator.batch.input import BatchInput, Slicer, Spill
from provider_emulator.batch.job import BatchJob, ItemFault, Outcome, Phase, limits_for
from provider_emulator.batch.runner import Answer, Output
from provider_emulator.batch.store import StoredFile
from provider_emulator.errors import RequestError
from provider_emulator.family import json_response

logger = logging.getLogger(__name__)

CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")
WINDOW_S = 24 * 3600
_ITEM_FAULTS = {
    ItemFault.SERVER: ("api_error", "Internal server error"),
    ItemFault.INVALID: ("invalid_request_error", "Invalid request (injected by the emulator)."),
}
_UNFINISHED = {Outcome.CANCELLED: "canceled", Outcome.EXPIRED: "expired"}


class AnthropicDialect:
    """One message batch: requests spilled to disk at creation, MessageBatchResult lines."""

    shuffled = True
    split_errors = False
    fails_per_item = True  # Anthropic has no whole-batch failure: every request errors instead
    expired_keeps_results = True

    def __init__(self, family: AnthropicFamily, source: BatchInput) -> None:
        self.family = family
        self.state = family.state
        self._source = source

    async def prepare(self, job: BatchJob) -> BatchInput | None:
        return self._source  # checked when the batch was created

    @staticmethod
    def _line(custom_id: str, result: dict[str, Any]) -> bytes:
        line = {"custom_id": custom_id, "result": result}
        return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)

    def _errored(self, custom_id: str, kind: str, message: str) -> bytes:
        error = {"type": "error", "error": {"type": kind, "message": message}, "request_id": None}
        return self._line(custom_id, {"type": "errored", "error": error})

    async def answer(self, item: bytes) -> Answer:
        data = orjson.loads(item)
        custom_id = data["custom_id"]
        try:
            prompt = self.family.parse_body(data["params"])
            reply = await self.state.responder.respond(prompt)
        except RequestError as error:
            return Answer(self._errored(custom_id, "invalid_request_error", error.message), False)
        except Exception:
            logger.exception("the %s responder failed", self.state.config.responder)
            return Answer(self._errored(custom_id, *_ITEM_FAULTS[ItemFault.SERVER]), False)
        message = self.family.render(prompt, reply, tier="batch")
        line = self._line(custom_id, {"type": "succeeded", "message": message})
        return Answer(line, True, reply.input_tokens, reply.output_tokens)

    def fault(self, item: bytes, fault: ItemFault) -> bytes:
        return self._errored(orjson.loads(item)["custom_id"], *_ITEM_FAULTS[fault])

    def unfinished(self, item: bytes, outcome: Outcome) -> bytes | None:
        return self._line(orjson.loads(item)["custom_id"], {"type": _UNFINISHED[outcome]})

    def fail_batch(self, job: BatchJob) -> None:  # never called: fails_per_item
        raise NotImplementedError

    def publish(self, job: BatchJob, output: Output, errors: Output | None) -> None:
        job.paths.append(output.path)
        job.outputs["results"] = StoredFile(
            job.id + "-results", output.path, output.size, time.time(), "results.jsonl", "results"
        )


def batch_json(
    job: BatchJob, now: float, base_url: str, *, initial: bool = False
) -> dict[str, Any]:
    """The MessageBatch at ``now``; counts stay ``processing`` until the whole batch ends."""
    phase = Phase.RUNNING if initial else job.phase(now)
    ended = phase is Phase.ENDED
    counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
    if ended:
        # An emulator failure (the only FAILED outcome here) errors every request.
        counts["errored"] = job.total if job.outcome is Outcome.FAILED else job.errored
        counts.update(succeeded=job.succeeded, canceled=job.canceled, expired=job.expired)
        status = "ended"
    else:
        counts["processing"] = job.total
        status = "canceling" if phase is Phase.CANCELLING else "in_progress"
    return {
        "id": job.id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": counts,
        "ended_at": rfc3339(job.ended_at) if ended and job.ended_at else None,
        "created_at": rfc3339(job.created_at),
        "expires_at": rfc3339(job.created_at + WINDOW_S),
        "archived_at": None,
        "cancel_initiated_at": None if job.cancel_at is None else rfc3339(job.cancel_at),
        "results_url": f"{base_url}/v1/messages/batches/{job.id}/results" if ended else None,
    }


class AnthropicBatches:
    def __init__(self, family: AnthropicFamily) -> None:
        self.family = family
        self.state = family.state

    def _job(self, request: web.Request) -> BatchJob:
        if "anthropic-version" not in request.headers:
            raise RequestError("anthropic-version: header is required")
        batch_id = request.match_info["batch_id"]
        job = self.state.batches.jobs.get(batch_id)
        if job is None or job.provider != "anthropic":
            raise RequestError(f"Message batch {batch_id} not found.", status=404)
        return job

    def _answer(self, request: web.Request, job: BatchJob, now: float) -> web.Response:
        return json_response(batch_json(job, now, origin(request)))

    async def create(self, request: web.Request) -> web.Response:
        if "anthropic-version" not in request.headers:
            raise RequestError("anthropic-version: header is required")
        limits = limits_for("anthropic", self.state.config)
        body, _ = await read_json(
            request,
            limits.max_bytes,
            f"Request exceeds the maximum size of {limits.max_bytes} bytes for a message batch.",
        )
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            raise RequestError("requests: List should have at least 1 item")
        if limits.max_requests is not None and len(requests) > limits.max_requests:
            raise RequestError(f"requests: List should have at most {limits.max_requests} items")
        spill = Spill(self.state.batches.new_path("anthropic-requests.jsonl"))
        try:
            await self._check_and_spill(requests, spill)
        except BaseException:
            spill.done().close()  # removes the spill file
            raise
        fate, seed = self.state.fates.draw()
        delay = self.state.config.batch_delay_s
        job = BatchJob("msgbatch_" + self.state.new_id(), "anthropic", delay, fate, seed)
        job.total = len(requests)
        self.state.runner.start(job, AnthropicDialect(self.family, spill.done()))
        self.state.stats.count_batch("anthropic")
        return json_response(batch_json(job, job.created_at, origin(request), initial=True))

    @staticmethod
    async def _check_and_spill(requests: list[Any], spill: Spill) -> None:
        seen: set[str] = set()
        slicer = Slicer()
        for index, entry in enumerate(requests):
            if not isinstance(entry, dict):
                raise RequestError(f"requests.{index}: Input should be a valid dictionary")
            custom_id = entry.get("custom_id")
            if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
                raise RequestError(
                    f"requests.{index}.custom_id: String should match pattern "
                    "'^[a-zA-Z0-9_-]{1,64}$'"
                )
            if custom_id in seen:
                raise RequestError(
                    f"requests.{index}.custom_id: Duplicate custom_id {custom_id!r}; "
                    "custom_id must be unique within a message batch"
                )
            seen.add(custom_id)
            params = entry.get("params")
            if not isinstance(params, dict):
                raise RequestError(f"requests.{index}.params: Field required")
            spill.add({"custom_id": custom_id, "params": params})
            await slicer.tick()

    async def retrieve(self, request: web.Request) -> web.Response:
        return self._answer(request, self._job(request), time.time())

    async def cancel(self, request: web.Request) -> web.Response:
        job = self._job(request)
        now = time.time()
        if not job.ended(now):
            job.cancel(now)
        return self._answer(request, job, now)

    async def delete(self, request: web.Request) -> web.Response:
        job = self._job(request)
        if not job.ended(time.time()):
            raise RequestError(
                f"Message batch {job.id} has not ended yet; cancel it and wait until it has "
                "ended before deleting it."
            )
        self.state.batches.delete_job(job.id)
        return json_response({"id": job.id, "type": "message_batch_deleted"})

    async def results(self, request: web.Request) -> web.StreamResponse:
        job = self._job(request)
        results = job.outputs.get("results")
        if not job.ended(time.time()) or results is None:
            raise RequestError(
                f"Message batch {job.id} has no results yet: they are ready once it has ended."
            )
        return result_file_response(self.family.state.result_downloads, results.path)

    async def list(self, request: web.Request) -> web.Response:
        if "anthropic-version" not in request.headers:
            raise RequestError("anthropic-version: header is required")
        limit = query_int(request, "limit", 20, 1, 1000)
        jobs = self.state.batches.jobs_of("anthropic")
        ids = [job.id for job in jobs]
        before, after = request.query.get("before_id"), request.query.get("after_id")
        for cursor in (before, after):
            if cursor and cursor not in ids:
                raise RequestError(f"Message batch {cursor} not found.", status=404)
        if before:
            end = ids.index(before)
            page, more = jobs[max(0, end - limit) : end], end - limit > 0
        else:
            start = ids.index(after) + 1 if after else 0
            page, more = jobs[start : start + limit], start + limit < len(jobs)
        now = time.time()
        return json_response(
            {
                "data": [batch_json(job, now, origin(request)) for job in page],
                "has_more": more,
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
            }
        )
