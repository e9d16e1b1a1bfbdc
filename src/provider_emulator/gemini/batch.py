"""Gemini Batch Mode: POST /{v}/models/{model}:batchGenerateContent, and on /{v}/batches:
GET (one, or the list), POST {id}:cancel, DELETE {id}.

A job is an Operation: ``metadata`` is the GenerateContentBatch (``BATCH_STATE_*``, string
``batchStats``), and once ``done`` the output sits in ``response`` and in ``metadata.output``:
``inlinedResponses.inlinedResponses`` for inline jobs, ``responsesFile`` for file jobs. Results
keep the input order. Expired jobs have no results; cancelled ones keep the finished ones.
"""

from __future__ import annotations

import logging
import secrets
import time
from array import array
from typing import Any, BinaryIO

import orjson
from aiohttp import web

from provider_emulator.batch.http import page_after, query_int, read_json, rfc3339
from provider_emulator.batch.input import BatchInput, Slicer, Spill, scan_lines
from provider_emulator.batch.job import BatchJob, ItemFault, Outcome, Phase, limits_for
from provider_emulator.batch.runner import Answer, Output
from provider_emulator.batch.store import StoredFile
from provider_emulator.errors import RequestError
from provider_emulator.gemini.api import GeminiFamily, get_field
from provider_emulator.gemini.files import PREFIX as FILE_PREFIX

logger = logging.getLogger(__name__)

PREFIX = "batches/"
_API = "type.googleapis.com/google.ai.generativelanguage.v1beta."
_BATCH_TYPE = _API + "GenerateContentBatch"
_OUTPUT_TYPE = _API + "GenerateContentBatchOutput"
# Stands in for the inlined responses while the Operation is serialized; they are spliced in
# as raw bytes from disk, never parsed back. Random, so that no request text can collide.
_INLINED = f"__inlined_responses_{secrets.token_hex(8)}__"
_INLINED_BYTES = orjson.dumps(_INLINED)
_STATE = {
    Phase.VALIDATING: "BATCH_STATE_PENDING",
    Phase.RUNNING: "BATCH_STATE_RUNNING",
    Phase.FINALIZING: "BATCH_STATE_RUNNING",
    Phase.CANCELLING: "BATCH_STATE_RUNNING",
}
_END_STATE = {
    Outcome.COMPLETED: "BATCH_STATE_SUCCEEDED",
    Outcome.FAILED: "BATCH_STATE_FAILED",
    Outcome.EXPIRED: "BATCH_STATE_EXPIRED",
    Outcome.CANCELLED: "BATCH_STATE_CANCELLED",
}
# google.rpc.Code numbers.
INVALID_ARGUMENT, INTERNAL = 3, 13
_ITEM_FAULTS = {
    ItemFault.SERVER: (INTERNAL, "Internal error encountered."),
    ItemFault.INVALID: (INVALID_ARGUMENT, "Request contains an invalid argument."),
}


class GeminiDialect:
    """One Gemini job: inline requests (spilled to disk at creation) or an uploaded file."""

    shuffled = False  # the API keeps the input order
    split_errors = False
    fails_per_item = False
    expired_keeps_results = False

    def __init__(
        self,
        family: GeminiFamily,
        model: str,
        *,
        inline: BatchInput | None = None,
        file: tuple[BinaryIO, int | None] | None = None,
    ) -> None:
        self.family = family
        self.state = family.state
        self.model = model
        self._inline = inline
        self._file = file

    async def prepare(self, job: BatchJob) -> BatchInput | None:
        if self._inline is not None:
            return self._inline
        assert self._file is not None
        handle, limit = self._file
        offsets: array[int] = array("q")
        async for _, offset, _ in scan_lines(handle):
            offsets.append(offset)
        if limit is not None and len(offsets) > limit:
            job.errors = [
                {
                    "code": INVALID_ARGUMENT,
                    "message": f"The input file has {len(offsets)} requests; "
                    f"a batch takes at most {limit}.",
                }
            ]
        elif not offsets:
            job.errors = [{"code": INVALID_ARGUMENT, "message": "The input file is empty."}]
        if job.errors:
            handle.close()
            return None
        return BatchInput(handle, offsets)

    def _line(self, item: dict[str, Any], outcome: dict[str, Any]) -> bytes:
        """An inline entry {metadata, response|error}, or a file line {key, response|error}."""
        if self._inline is not None:
            metadata = item.get("metadata")
            line = outcome if metadata is None else {"metadata": metadata, **outcome}
        else:
            line = {"key": item.get("key"), **outcome}
        return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)

    def _error(self, item: dict[str, Any], code: int, message: str) -> bytes:
        error: dict[str, Any] = {"code": code, "message": message}
        if self._inline is not None:
            error["details"] = []
        return self._line(item, {"error": error})

    async def answer(self, item: bytes) -> Answer:
        try:
            data = orjson.loads(item)
        except orjson.JSONDecodeError:
            data = None
        request = data.get("request") if isinstance(data, dict) else None
        if not isinstance(request, dict):
            entry = data if isinstance(data, dict) else {}
            message = "Each line needs a 'request' object."
            return Answer(self._error(entry, INVALID_ARGUMENT, message), False)
        model = str(request.get("model") or self.model).removeprefix("models/")
        try:
            prompt = self.family.parse_body(request, model)
            reply = await self.state.responder.respond(prompt)
        except RequestError as error:
            return Answer(self._error(data, INVALID_ARGUMENT, error.message), False)
        except Exception:
            logger.exception("the %s responder failed", self.state.config.responder)
            return Answer(self._error(data, *_ITEM_FAULTS[ItemFault.SERVER]), False)
        line = self._line(data, {"response": self.family.render(prompt, reply)})
        return Answer(line, True, reply.input_tokens, reply.output_tokens)

    def fault(self, item: bytes, fault: ItemFault) -> bytes:
        try:
            data = orjson.loads(item)
        except orjson.JSONDecodeError:
            data = {}
        return self._error(data if isinstance(data, dict) else {}, *_ITEM_FAULTS[fault])

    def unfinished(self, item: bytes, outcome: Outcome) -> bytes | None:
        return None  # unfinished requests leave no trace in Gemini's results

    def fail_batch(self, job: BatchJob) -> None:
        message = "The batch job failed: enqueued token quota exceeded (injected by the emulator)."
        job.errors = [{"code": INTERNAL, "message": message}]

    def publish(self, job: BatchJob, output: Output, errors: Output | None) -> None:
        if not output.lines:  # nothing finished: no output at all
            output.path.unlink(missing_ok=True)
            return
        now = time.time()
        if self._inline is not None:
            job.paths.append(output.path)
            job.outputs["inline"] = StoredFile(
                job.id, output.path, output.size, now, "inlined", "inline"
            )
            return
        name = f"{FILE_PREFIX}batch-{self.state.new_id()}"
        job.outputs["file"] = self.state.batches.add_file(
            StoredFile(name, output.path, output.size, now, name, "GENERATED")
        )


def operation(job: BatchJob, now: float, *, initial: bool = False) -> bytes:
    """The job's Operation JSON at ``now``; ``initial``: as the create call answers it."""
    phase = Phase.VALIDATING if initial else job.phase(now)
    ended = phase is Phase.ENDED
    done = job.succeeded + job.errored
    metadata: dict[str, Any] = {
        "@type": _BATCH_TYPE,
        "name": job.id,
        "displayName": job.options.get("display_name") or job.id,
        "model": "models/" + job.options["model"],
        "state": _END_STATE[job.outcome] if ended and job.outcome else _STATE[phase],
        "createTime": rfc3339(job.created_at),
        "updateTime": rfc3339(job.ended_at if ended and job.ended_at else now),
        "batchStats": {
            "requestCount": str(job.total),
            "successfulRequestCount": str(job.succeeded if not initial else 0),
            "failedRequestCount": str(job.errored if not initial else 0),
            "pendingRequestCount": str(job.total - (done if not initial else 0)),
        },
    }
    operation: dict[str, Any] = {"name": job.id, "metadata": metadata}
    inline = job.outputs.get("inline")
    if ended:
        metadata["endTime"] = rfc3339(job.ended_at or now)
        operation["done"] = True
        output = _output(job)
        if job.outcome is Outcome.FAILED:
            first = job.errors[0] if job.errors else {}
            code = first.get("code")
            operation["error"] = {
                "code": code if isinstance(code, int) else INTERNAL,
                "message": str(first.get("message") or "The batch job failed."),
            }
        elif output is not None:
            metadata["output"] = output
            operation["response"] = {"@type": _OUTPUT_TYPE, **output}
    data = orjson.dumps(operation)
    if ended and inline is not None:
        entries = inline.path.read_bytes().rstrip(b"\n").replace(b"\n", b",")
        data = data.replace(_INLINED_BYTES, b"[" + entries + b"]")
    return data


def _output(job: BatchJob) -> dict[str, Any] | None:
    if "inline" in job.outputs:
        return {"inlinedResponses": {"inlinedResponses": _INLINED}}
    file = job.outputs.get("file")
    return None if file is None else {"responsesFile": file.id}


def _json(data: bytes) -> web.Response:
    return web.Response(body=data, content_type="application/json")


class GeminiBatches:
    def __init__(self, family: GeminiFamily) -> None:
        self.family = family
        self.state = family.state

    def _job(self, request: web.Request, suffix: str = "") -> BatchJob:
        ref = request.match_info["batch_id"]
        if suffix:
            ref = ref.removesuffix(suffix)
        job = self.state.batches.jobs.get(PREFIX + ref)
        if job is None or job.provider != "gemini":
            raise RequestError(f"Batch {PREFIX + ref} not found.", status=404)
        return job

    async def create(self, request: web.Request) -> web.Response:
        model = request.match_info["model_action"].rpartition(":")[0]
        config = self.state.config
        inline_limits = limits_for("gemini-inline", config)
        body, _ = await read_json(
            request,
            inline_limits.max_bytes,
            f"The inline requests exceed {inline_limits.max_bytes} bytes; "
            "upload them as a file instead.",
        )
        batch = body.get("batch", body) if isinstance(body, dict) else None
        if not isinstance(batch, dict):
            raise RequestError("* BatchGenerateContentRequest.batch: required")
        input_config = get_field(batch, "inputConfig", "input_config")
        if not isinstance(input_config, dict):
            raise RequestError("* BatchGenerateContentRequest.batch.input_config: required")
        requests = input_config.get("requests")
        file_name = get_field(input_config, "fileName", "file_name")
        if isinstance(requests, dict):
            dialect, total = await self._inline(model, requests, inline_limits.max_requests)
        elif isinstance(file_name, str) and file_name:
            dialect, total = self._from_file(model, file_name), 0
        else:
            raise RequestError(
                "* BatchGenerateContentRequest.batch.input_config: give requests or file_name"
            )
        fate, seed = self.state.fates.draw()
        job = BatchJob(
            PREFIX + self.state.new_id(),
            "gemini",
            config.batch_delay_s,
            fate,
            seed,
            options={
                "model": model,
                "display_name": get_field(batch, "displayName", "display_name"),
            },
        )
        job.total = total
        self.state.runner.start(job, dialect)
        self.state.stats.count_batch("gemini")
        return _json(operation(job, job.created_at, initial=True))

    async def _inline(
        self, model: str, requests: dict[str, Any], max_requests: int | None
    ) -> tuple[GeminiDialect, int]:
        entries = requests.get("requests")
        if not isinstance(entries, list) or not entries:
            raise RequestError("* BatchGenerateContentRequest.batch.input_config.requests: empty")
        if max_requests is not None and len(entries) > max_requests:
            raise RequestError(
                f"The batch has {len(entries)} requests; it may have at most {max_requests}."
            )
        spill = Spill(self.state.batches.new_path("gemini-requests.jsonl"))
        slicer = Slicer()
        try:
            for index, entry in enumerate(entries):
                if not isinstance(entry, dict) or not isinstance(entry.get("request"), dict):
                    raise RequestError(
                        f"* BatchGenerateContentRequest.batch.input_config.requests.requests"
                        f"[{index}].request: required"
                    )
                spill.add({"request": entry["request"], "metadata": entry.get("metadata")})
                await slicer.tick()
        except BaseException:
            spill.done().close()
            raise
        return GeminiDialect(self.family, model, inline=spill.done()), len(entries)

    def _from_file(self, model: str, file_name: str) -> GeminiDialect:
        file = self.state.batches.files.get(file_name)
        if file is None or not file_name.startswith(FILE_PREFIX):
            raise RequestError(f"File {file_name} not found.", status=404)
        limits = limits_for("gemini-file", self.state.config)
        if file.size > limits.max_bytes:
            raise RequestError(
                f"The input file has {file.size} bytes; a batch file may have {limits.max_bytes}."
            )
        return GeminiDialect(self.family, model, file=(file.path.open("rb"), limits.max_requests))

    async def retrieve(self, request: web.Request) -> web.Response:
        return _json(operation(self._job(request), time.time()))

    async def cancel(self, request: web.Request) -> web.Response:
        job = self._job(request, ":cancel")
        now = time.time()
        if not job.ended(now):
            job.cancel(now)
        return _json(b"{}")

    async def delete(self, request: web.Request) -> web.Response:
        job = self._job(request)
        self.state.batches.delete_job(job.id)
        return _json(b"{}")

    async def list(self, request: web.Request) -> web.Response:
        size = query_int(request, "pageSize", 50, 1, 1000)
        jobs = self.state.batches.jobs_of("gemini")
        page, more = page_after(jobs, lambda job: job.id, request.query.get("pageToken"), size)
        now = time.time()
        data = b'{"operations":[' + b",".join(operation(job, now) for job in page) + b"]"
        if more:
            data += b',"nextPageToken":' + orjson.dumps(page[-1].id)
        return _json(data + b"}")

    async def post(self, request: web.Request) -> web.StreamResponse:
        """POST /{v}/batches/{id}:{action}: only ``cancel`` exists."""
        if request.match_info["batch_id"].endswith(":cancel"):
            return await self.cancel(request)
        raise RequestError("Unknown batch method; only :cancel exists.", status=404)
