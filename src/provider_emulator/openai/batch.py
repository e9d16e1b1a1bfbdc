"""OpenAI Batches: POST/GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel.

The input file is checked line by line while the batch is ``validating``; a bad file ends it
``failed`` with ``errors.data`` [{code, message, param, line}]. The codes are the emulator's
own where OpenAI documents none: ``invalid_json_line``, ``missing_required_parameter``,
``duplicate_custom_id``, ``invalid_value`` (method or url), ``mismatched_model``,
``request_limit_exceeded``, ``file_size_limit_exceeded``, ``empty_file``.
"""

from __future__ import annotations

import logging
import time
from array import array
from typing import Any, BinaryIO

import orjson
from aiohttp import web

from provider_emulator.batch.http import page_after, query_int
from provider_emulator.batch.input import BatchInput, scan_lines
from provider_emulator.batch.job import BatchJob, ItemFault, Limits, Outcome, limits_for
from provider_emulator.batch.runner import Answer, Output
from provider_emulator.batch.store import StoredFile
from provider_emulator.errors import RequestError
from provider_emulator.family import json_response
from provider_emulator.openai.api import OpenAIFamily, error_body
from provider_emulator.openai.batch_object import batch_json
from provider_emulator.openai.files import ID_PREFIX as FILE_PREFIX
from provider_emulator.wire_json import dumps

logger = logging.getLogger(__name__)

ENDPOINT = "/v1/chat/completions"  # the only endpoint the emulator answers
KNOWN_ENDPOINTS = (ENDPOINT, "/v1/responses", "/v1/embeddings", "/v1/completions")
MAX_VALIDATION_ERRORS = 100
_UNFINISHED = {
    Outcome.CANCELLED: (
        "batch_cancelled",
        "This request was not executed because the batch was cancelled.",
    ),
    Outcome.EXPIRED: (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
}
_ITEM_FAULTS = {
    ItemFault.SERVER: (
        500,
        error_body(
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
        ),
    ),
    ItemFault.INVALID: (
        400,
        error_body(
            "Invalid request (injected by the emulator).", "invalid_request_error", None, None
        ),
    ),
}
Problem = tuple[str, str, str | None]  # code, message, param


class OpenAIDialect:
    """One OpenAI batch: its input checks and its BatchRequestOutput lines."""

    shuffled = True
    split_errors = True
    fails_per_item = False
    expired_keeps_results = True

    def __init__(self, family: OpenAIFamily, handle: BinaryIO, size: int, limits: Limits) -> None:
        self.family = family
        self.state = family.state
        self._handle = handle
        self._size = size
        self._limits = limits

    # -- validation --------------------------------------------------------------------------

    async def prepare(self, job: BatchJob) -> BatchInput | None:
        errors: list[dict[str, Any]] = []
        offsets: array[int] = array("q")
        if self._size > self._limits.max_bytes:
            message = f"The input file is {self._size} bytes; a batch takes at most "
            errors.append(
                _error("file_size_limit_exceeded", message + f"{self._limits.max_bytes}.")
            )
        else:
            await self._check_lines(job, errors, offsets)
        if not errors and not offsets:
            errors.append(_error("empty_file", "The input file holds no requests."))
        if errors:
            self._handle.close()
            job.errors = errors
            return None
        return BatchInput(self._handle, offsets)

    async def _check_lines(
        self, job: BatchJob, errors: list[dict[str, Any]], offsets: array[int]
    ) -> None:
        seen: set[str] = set()
        endpoint = job.options["endpoint"]
        limit = self._limits.max_requests
        async for number, offset, line in scan_lines(self._handle):
            problem = self._check(line, endpoint, seen, job.options)
            if problem is not None:
                errors.append(_error(*problem, line=number))
                if len(errors) >= MAX_VALIDATION_ERRORS:
                    return
                continue
            offsets.append(offset)
            if limit is not None and len(offsets) > limit:
                errors.append(
                    _error(
                        "request_limit_exceeded",
                        f"The input file has more than {limit} requests, the most a batch takes.",
                        line=number,
                    )
                )
                return

    @staticmethod
    def _check(
        line: bytes, endpoint: str, seen: set[str], options: dict[str, Any]
    ) -> Problem | None:
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            return "invalid_json_line", "This line is not a JSON object.", None
        custom_id = data.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            return _missing("custom_id")
        if custom_id in seen:
            return "duplicate_custom_id", f"The custom_id {custom_id!r} is used twice.", "custom_id"
        seen.add(custom_id)
        if data.get("method") != "POST":
            return "invalid_value", "The method must be 'POST'.", "method"
        if data.get("url") != endpoint:
            message = f"The url must be the batch's endpoint {endpoint!r}, got {data.get('url')!r}."
            return "invalid_value", message, "url"
        body = data.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            return _missing("body.model")
        first = options.setdefault("model", model)
        if model != first:
            message = f"Every request of a batch must use one model: {first!r}, then {model!r}."
            return "mismatched_model", message, "body.model"
        return None

    # -- result lines ------------------------------------------------------------------------

    def _line(self, custom_id: str, status: int | None, body: Any, error: Any = None) -> bytes:
        ident = self.state.new_id()
        response = None
        if status is not None:
            response = {"status_code": status, "request_id": "req_" + ident, "body": body}
        line = {"id": "batch_req_" + ident, "custom_id": custom_id, "response": response}
        line["error"] = error
        return dumps(line, newline=True)  # a lone surrogate in an answer stays an escape

    async def answer(self, item: bytes) -> Answer:
        data = orjson.loads(item)
        custom_id = data["custom_id"]
        try:
            prompt = self.family.parse_body(data["body"])
            reply = await self.state.responder.respond(prompt)
        except RequestError as error:
            body = error_body(error.message, "invalid_request_error", error.param, error.code)
            return Answer(self._line(custom_id, error.status, body), False)
        except Exception:
            logger.exception("the %s responder failed", self.state.config.responder)
            return Answer(self._line(custom_id, *_ITEM_FAULTS[ItemFault.SERVER]), False)
        line = self._line(custom_id, 200, self.family.render(prompt, reply))
        return Answer(line, True, reply.input_tokens, reply.output_tokens)

    def fault(self, item: bytes, fault: ItemFault) -> bytes:
        return self._line(orjson.loads(item)["custom_id"], *_ITEM_FAULTS[fault])

    def unfinished(self, item: bytes, outcome: Outcome) -> bytes | None:
        code, message = _UNFINISHED[outcome]
        error = {"code": code, "message": message}
        return self._line(orjson.loads(item)["custom_id"], None, None, error)

    def fail_batch(self, job: BatchJob) -> None:
        model = job.options.get("model", "the model")
        message = (
            f"Enqueued token limit reached for {model} in organization org-emulator. "
            "Please try again once some in_progress batches have been completed."
        )
        job.errors = [_error("token_limit_exceeded", message)]

    def publish(self, job: BatchJob, output: Output, errors: Output | None) -> None:
        for role, written in (("output", output), ("error", errors)):
            if written is None:
                continue
            if not written.lines:
                written.path.unlink(missing_ok=True)
                continue
            job.outputs[role] = self.state.batches.add_file(
                StoredFile(
                    FILE_PREFIX + self.state.new_id(),
                    written.path,
                    written.size,
                    time.time(),
                    f"{job.id}_{role}.jsonl",
                    "batch_output",
                )
            )


def _missing(param: str) -> Problem:
    return "missing_required_parameter", f"Missing required parameter: '{param}'.", param


def _error(
    code: str, message: str, param: str | None = None, line: int | None = None
) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


class OpenAIBatches:
    def __init__(self, family: OpenAIFamily) -> None:
        self.family = family
        self.state = family.state

    def _job(self, request: web.Request) -> BatchJob:
        batch_id = request.match_info["batch_id"]
        job = self.state.batches.jobs.get(batch_id)
        if job is None or job.provider != "openai":
            raise RequestError(f"No batch found with id '{batch_id}'.", status=404, param="id")
        return job

    async def create(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise RequestError("The request body is not valid JSON.") from None
        if not isinstance(body, dict):
            raise RequestError("The request body must be a JSON object.")
        options = self._options(body)
        file = self._input_file(body.get("input_file_id"))
        fate, seed = self.state.fates.draw()
        job = BatchJob(
            "batch_" + self.state.new_id(),
            "openai",
            self.state.config.batch_delay_s,
            fate,
            seed,
            options={**options, "input_file_id": file.id},
        )
        # Opened now, so that deleting the input file later cannot pull it from under the job.
        handle = file.path.open("rb")
        limits = limits_for("openai", self.state.config)
        self.state.runner.start(job, OpenAIDialect(self.family, handle, file.size, limits))
        self.state.stats.count_batch("openai")
        return json_response(batch_json(job, job.created_at, initial=True))

    @staticmethod
    def _options(body: dict[str, Any]) -> dict[str, Any]:
        endpoint = body.get("endpoint")
        if endpoint not in KNOWN_ENDPOINTS:
            raise RequestError(
                f"Invalid value for 'endpoint': {endpoint!r}.",
                param="endpoint",
                code="invalid_value",
            )
        if endpoint != ENDPOINT:
            raise RequestError(
                f"The emulator answers only {ENDPOINT} batches, not {endpoint}.", param="endpoint"
            )
        if body.get("completion_window") != "24h":
            raise RequestError(
                "Invalid value for 'completion_window': only '24h' is supported.",
                param="completion_window",
                code="invalid_value",
            )
        metadata = body.get("metadata")
        if metadata is not None and not _valid_metadata(metadata):
            raise RequestError(
                "Invalid 'metadata': at most 16 pairs of strings, keys up to 64 characters "
                "and values up to 512.",
                param="metadata",
            )
        return {"endpoint": endpoint, "metadata": metadata}

    def _input_file(self, file_id: Any) -> StoredFile:
        if not isinstance(file_id, str) or not file_id:
            raise RequestError(
                "Missing required parameter: 'input_file_id'.",
                param="input_file_id",
                code="missing_required_parameter",
            )
        file = self.state.batches.files.get(file_id)
        if file is None or not file_id.startswith(FILE_PREFIX):
            raise RequestError(
                f"Invalid 'input_file_id': {file_id!r}: no such file.", param="input_file_id"
            )
        if file.purpose != "batch":
            raise RequestError(
                f"The input file {file_id} has purpose {file.purpose!r}; it must be 'batch'.",
                param="input_file_id",
            )
        return file

    async def retrieve(self, request: web.Request) -> web.Response:
        return json_response(batch_json(self._job(request), time.time()))

    async def cancel(self, request: web.Request) -> web.Response:
        job = self._job(request)
        now = time.time()
        if job.ended(now):
            status = batch_json(job, now)["status"]
            raise RequestError(f"Cannot cancel a batch with status '{status}'.")
        job.cancel(now)
        return json_response(batch_json(job, now))

    async def list(self, request: web.Request) -> web.Response:
        limit = query_int(request, "limit", 20, 1, 100)
        jobs = self.state.batches.jobs_of("openai")
        page, more = page_after(jobs, lambda job: job.id, request.query.get("after"), limit)
        now = time.time()
        return json_response(
            {
                "object": "list",
                "data": [batch_json(job, now) for job in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": more,
            }
        )


def _valid_metadata(metadata: Any) -> bool:
    return (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        )
    )
