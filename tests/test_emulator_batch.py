"""The emulator's batch endpoints, driven by the official SDKs (openai files + batches,
anthropic messages.batches, google-genai batches + files), plus raw HTTP where the wire shape
itself is the point (Gemini's Operation JSON, snake_case bodies, the download path)."""

from __future__ import annotations

import glob
import io
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TypeVar

import anthropic
import openai
import orjson
import pytest
from click.testing import CliRunner
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from pydantic import BaseModel

from mmirage.cli import main as mmirage_main
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.__main__ import _parser
from provider_emulator.runner import EmulatorHandle

KEY = "test-key"
CHAT: Final = "/v1/chat/completions"
T = TypeVar("T")
JOB = genai_types.JobState


class Answer(BaseModel):
    label: str
    score: int


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorHandle]:
    with running_emulator(EmulatorConfig(seed=11)) as handle:
        yield handle


# -- helpers -------------------------------------------------------------------------------


def chat_line(i: int, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"question {i}"}]
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": CHAT,
        "body": {"model": "gpt-4o-mini", "messages": messages, **body},
    }


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(row) + b"\n" for row in rows)


def parse_jsonl(data: bytes | str) -> list[dict[str, Any]]:
    text = data.encode() if isinstance(data, str) else data
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def oai(emu: EmulatorHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)


def claude(emu: EmulatorHandle) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=emu.anthropic_base_url, api_key=KEY, max_retries=0)


def gemini(emu: EmulatorHandle) -> genai.Client:
    return genai.Client(
        api_key=KEY, http_options=genai_types.HttpOptions(base_url=emu.gemini_base_url)
    )


def wait_for(fetch: Callable[[], T], done: Callable[[T], bool], timeout_s: float = 60.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = fetch()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def openai_batch(
    client: openai.OpenAI, rows: list[dict[str, Any]], **options: Any
) -> openai.types.Batch:
    file = client.files.create(file=("input.jsonl", jsonl(rows)), purpose="batch")
    return client.batches.create(
        input_file_id=file.id, endpoint=CHAT, completion_window="24h", **options
    )


def openai_final(client: openai.OpenAI, batch_id: str) -> openai.types.Batch:
    final = ("completed", "failed", "expired", "cancelled")
    return wait_for(lambda: client.batches.retrieve(batch_id), lambda b: b.status in final)


def claude_requests(count: int, prefix: str = "r") -> list[Any]:
    return [
        {
            "custom_id": f"{prefix}{i}",
            "params": {
                "model": "claude-haiku-4-5",
                "max_tokens": 32,
                "messages": [{"role": "user", "content": f"hello {i}"}],
            },
        }
        for i in range(count)
    ]


def claude_ended(client: anthropic.Anthropic, batch_id: str) -> Any:
    return wait_for(
        lambda: client.messages.batches.retrieve(batch_id),
        lambda b: b.processing_status == "ended",
    )


def gemini_requests(count: int) -> list[Any]:
    return [
        {
            "contents": [{"role": "user", "parts": [{"text": f"item {i}"}]}],
            "metadata": {"key": f"k{i}"},
        }
        for i in range(count)
    ]


def gemini_final(client: genai.Client, name: str) -> genai_types.BatchJob:
    final = {
        JOB.JOB_STATE_SUCCEEDED,
        JOB.JOB_STATE_FAILED,
        JOB.JOB_STATE_CANCELLED,
        JOB.JOB_STATE_EXPIRED,
    }
    return wait_for(lambda: client.batches.get(name=name), lambda job: job.state in final)


def raw(emu: EmulatorHandle, path: str, body: Any = None, method: str = "GET") -> Any:
    """A Gemini call without the SDK: the wire JSON as sent."""
    data = None if body is None else orjson.dumps(body)
    request = urllib.request.Request(
        emu.url + path,
        data=data,
        method=method,
        headers={"x-goog-api-key": KEY, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return orjson.loads(reply.read())


# -- OpenAI ----------------------------------------------------------------------------------


def test_openai_files_and_batch_round_trip(emu: EmulatorHandle) -> None:
    client = oai(emu)
    schema = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": Answer.model_json_schema()},
    }
    rows = [chat_line(i) for i in range(30)] + [chat_line(30, response_format=schema)]
    created = openai_batch(client, rows, metadata={"job": "nightly"})
    assert created.status == "validating" and created.metadata == {"job": "nightly"}
    assert created.request_counts is not None and created.request_counts.total == 0
    assert created.in_progress_at is None and created.output_file_id is None
    # With batch_delay_s = 0 the first poll after creation already sees the end.
    batch = client.batches.retrieve(created.id)
    assert batch.status == "completed" and batch.model == "gpt-4o-mini"
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (31, 31)
    for stamp in (batch.in_progress_at, batch.finalizing_at, batch.completed_at):
        assert stamp is not None and stamp >= batch.created_at
    assert batch.expires_at == batch.created_at + 24 * 3600
    assert batch.error_file_id is None and batch.errors is None
    assert batch.usage is not None and batch.usage.output_tokens > 0

    assert batch.output_file_id is not None
    lines = parse_jsonl(client.files.content(batch.output_file_id).content)
    by_id = {line["custom_id"]: line for line in lines}
    assert set(by_id) == {row["custom_id"] for row in rows}
    first = by_id["req-3"]
    assert first["error"] is None and first["id"].startswith("batch_req_")
    assert first["response"]["status_code"] == 200 and first["response"]["request_id"]
    completion = openai.types.chat.ChatCompletion.model_validate(first["response"]["body"])
    assert completion.choices[0].message.content == "echo: question 3"
    structured = by_id["req-30"]["response"]["body"]["choices"][0]["message"]["content"]
    Answer.model_validate_json(structured)

    output = client.files.retrieve(batch.output_file_id)
    assert output.purpose == "batch_output" and output.bytes > 0
    listed = [f.id for f in client.files.list(purpose="batch_output")]
    assert batch.output_file_id in listed
    assert client.files.delete(created.input_file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.input_file_id)


def test_openai_status_walk_and_cancel() -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=1.2, seed=3)) as emu:
        client = oai(emu)
        batch = openai_batch(client, [chat_line(i) for i in range(120)])
        seen: list[tuple[str, int]] = []
        while batch.status != "completed":
            batch = client.batches.retrieve(batch.id)
            assert batch.request_counts is not None
            seen.append((batch.status, batch.request_counts.total))
            time.sleep(0.02)
        statuses = [status for status, _ in seen]
        order = ["validating", "in_progress", "finalizing", "completed"]
        assert sorted(set(statuses), key=order.index) == order
        assert statuses == sorted(statuses, key=order.index)  # never goes back
        assert all(total == 0 for status, total in seen if status == "validating")
        assert batch.in_progress_at is not None and batch.finalizing_at is not None
        assert batch.completed_at is not None and batch.completed_at - batch.created_at >= 1

        file = client.files.create(
            file=("in.jsonl", jsonl([chat_line(i) for i in range(200)])), purpose="batch"
        )
        before_create = time.monotonic()
        cancelled = client.batches.create(
            input_file_id=file.id, endpoint=CHAT, completion_window="24h"
        )
        after_create = time.monotonic()
        time.sleep(0.45)
        before_cancel = time.monotonic()
        cancelling = client.batches.cancel(cancelled.id)
        after_cancel = time.monotonic()
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        final = openai_final(client, cancelled.id)
        assert final.status == "cancelled" and final.cancelled_at is not None
        assert final.request_counts is not None
        # The share finished is the share of batch_delay_s elapsed when the cancel arrived.
        done = final.request_counts.completed
        assert 200 * (before_cancel - after_create) / 1.2 - 2 <= done
        assert done <= 200 * (after_cancel - before_create) / 1.2 + 2
        assert final.output_file_id and final.error_file_id
        errors = parse_jsonl(client.files.content(final.error_file_id).content)
        assert len(errors) == 200 - done
        assert all(e["response"] is None for e in errors)
        assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
        with pytest.raises(openai.BadRequestError):
            client.batches.cancel(final.id)


def test_openai_error_file_holds_both_shapes_in_an_expired_batch() -> None:
    config = EmulatorConfig(batch_expire_rate=1.0, batch_item_error_rate=0.4, seed=5)
    with running_emulator(config) as emu:
        client = oai(emu)
        batch = openai_final(client, openai_batch(client, [chat_line(i) for i in range(60)]).id)
        assert batch.status == "expired" and batch.expired_at is not None
        assert batch.output_file_id and batch.error_file_id
        successes = parse_jsonl(client.files.content(batch.output_file_id).content)
        failures = parse_jsonl(client.files.content(batch.error_file_id).content)
    assert len(successes) + len(failures) == 60
    http = [f for f in failures if f["response"] is not None]
    expired = [f for f in failures if f["response"] is None]
    assert len(expired) == 30  # batch_expire_done_fraction 0.5 of them ran
    assert {f["error"]["code"] for f in expired} == {"batch_expired"}
    assert http and all(f["error"] is None for f in http)
    kinds = {(f["response"]["status_code"], f["response"]["body"]["error"]["type"]) for f in http}
    assert kinds == {(500, "server_error"), (400, "invalid_request_error")}
    assert batch.request_counts is not None
    assert batch.request_counts.failed == len(failures)


def test_openai_whole_batch_failure() -> None:
    with running_emulator(EmulatorConfig(batch_failure_rate=1.0)) as emu:
        client = oai(emu)
        batch = openai_final(client, openai_batch(client, [chat_line(0)]).id)
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.in_progress_at is None and batch.output_file_id is None
    assert batch.errors is not None and batch.errors.data
    assert batch.errors.data[0].code == "token_limit_exceeded"


def test_batch_fault_shares_hold_in_small_runs() -> None:
    config = EmulatorConfig(batch_failure_rate=0.25, batch_expire_rate=0.25, seed=4)
    with running_emulator(config) as emu:
        client = oai(emu)
        file = client.files.create(file=("in.jsonl", jsonl([chat_line(0)])), purpose="batch")
        ids = [
            client.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h").id
            for _ in range(8)
        ]
        statuses = sorted(openai_final(client, batch_id).status for batch_id in ids)
    assert statuses == ["completed"] * 4 + ["expired"] * 2 + ["failed"] * 2


def test_openai_validation_failures(emu: EmulatorHandle) -> None:
    client = oai(emu)
    duplicate = chat_line(1)
    wrong_url = {**chat_line(2), "url": "/v1/completions"}
    no_model = chat_line(3)
    del no_model["body"]["model"]
    file = client.files.create(
        file=(
            "bad.jsonl",
            jsonl([chat_line(1), duplicate, wrong_url]) + b"{oops\n" + jsonl([no_model]),
        ),
        purpose="batch",
    )
    created = client.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h")
    batch = openai_final(client, created.id)
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data
    found = [(e.code, e.param, e.line) for e in batch.errors.data]
    assert found == [
        ("duplicate_custom_id", "custom_id", 2),
        ("invalid_value", "url", 3),
        ("invalid_json_line", None, 4),
        ("missing_required_parameter", "body.model", 5),
    ]
    assert batch.request_counts is not None and batch.request_counts.total == 0

    refusals: list[dict[str, Any]] = [
        {"completion_window": "48h"},
        {"endpoint": "/v1/nope"},
        {"metadata": {f"k{i}": "v" for i in range(17)}},
        {"input_file_id": "file-missing"},
    ]
    for change in refusals:
        options = {"input_file_id": file.id, "endpoint": CHAT, "completion_window": "24h"}
        with pytest.raises(openai.BadRequestError):
            client.batches.create(**{**options, **change})
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_missing")


def test_openai_configured_limits() -> None:
    with running_emulator(EmulatorConfig(batch_max_requests=3, batch_max_bytes=600)) as emu:
        client = oai(emu)
        fits = openai_final(client, openai_batch(client, [chat_line(i) for i in range(3)]).id)
        too_many = openai_final(client, openai_batch(client, [chat_line(i) for i in range(4)]).id)
        long = [chat_line(0, temperature=0.5, user="x" * 700)]
        too_big = openai_final(client, openai_batch(client, long).id)
    assert fits.status == "completed"
    assert too_many.status == "failed" and too_many.errors and too_many.errors.data
    assert too_many.errors.data[0].code == "request_limit_exceeded"
    assert too_big.status == "failed" and too_big.errors and too_big.errors.data
    assert too_big.errors.data[0].code == "file_size_limit_exceeded"


def test_openai_list_is_newest_first_and_paginates() -> None:
    with running_emulator() as emu:
        client = oai(emu)
        file = client.files.create(file=("in.jsonl", jsonl([chat_line(0)])), purpose="batch")
        ids = [
            client.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h").id
            for _ in range(5)
        ]
        first = client.batches.list(limit=2)
        assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
        assert [b.id for b in client.batches.list(limit=2)] == ids[::-1]  # follows `after`
        last = client.batches.list(limit=10, after=ids[1])
        assert [b.id for b in last.data] == [ids[0]] and not last.has_more


# -- Anthropic ----------------------------------------------------------------------------------


def test_anthropic_results_decoder_reads_all_four_result_types() -> None:
    types: dict[str, set[str]] = {}
    bad: Any = {  # no max_tokens: refused only once the batch runs
        "custom_id": "no-max",
        "params": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
    }
    with running_emulator(EmulatorConfig(batch_expire_rate=1.0, seed=2)) as emu:
        client = claude(emu)
        batch = client.messages.batches.create(requests=[*claude_requests(20), bad])
        ended = claude_ended(client, batch.id)
        results = list(client.messages.batches.results(batch.id))
        for result in results:
            types.setdefault(result.result.type, set()).add(result.custom_id)
        assert ended.request_counts.expired == len(types["expired"]) > 0
        assert ended.request_counts.processing == 0
    # A long delay costs nothing here: a cancelled batch ends 10 % of it after the cancel.
    with running_emulator(EmulatorConfig(batch_delay_s=3.0)) as emu:
        client = claude(emu)
        batch = client.messages.batches.create(requests=claude_requests(50))
        time.sleep(0.3)
        canceling = client.messages.batches.cancel(batch.id)
        assert canceling.processing_status == "canceling"
        assert canceling.cancel_initiated_at is not None and canceling.results_url is None
        assert canceling.request_counts.processing == 50  # counts move only at the end
        ended = claude_ended(client, batch.id)
        for result in client.messages.batches.results(batch.id):
            types.setdefault(result.result.type, set()).add(result.custom_id)
        assert 0 < ended.request_counts.canceled < 50
    assert set(types) == {"succeeded", "errored", "canceled", "expired"}
    errored = next(r.result for r in results if r.custom_id == "no-max")
    assert errored.type == "errored" and errored.error.error.type == "invalid_request_error"
    assert "max_tokens" in errored.error.error.message
    succeeded = next(r.result for r in results if r.result.type == "succeeded")
    assert succeeded.type == "succeeded" and succeeded.message.usage.service_tier == "batch"


def test_anthropic_round_trip_list_cancel_delete() -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=1.0)) as emu:
        client = claude(emu)
        ids = [client.messages.batches.create(requests=claude_requests(4)).id for _ in range(3)]
        running = client.messages.batches.retrieve(ids[0])
        assert running.processing_status == "in_progress" and running.results_url is None
        assert running.request_counts.processing == 4 and running.ended_at is None
        with pytest.raises(anthropic.BadRequestError):
            client.messages.batches.delete(ids[0])  # only after it has ended
        assert [b.id for b in client.messages.batches.list(limit=2)] == ids[::-1]
        page = client.messages.batches.list(limit=1, before_id=ids[0])
        assert [b.id for b in page.data] == [ids[1]]
        ended = claude_ended(client, ids[0])
        assert ended.results_url == f"{emu.url}/v1/messages/batches/{ids[0]}/results"
        assert ended.request_counts.succeeded == 4 and ended.ended_at is not None
        texts = {r.custom_id: r.result for r in client.messages.batches.results(ids[0])}
        assert set(texts) == {"r0", "r1", "r2", "r3"}
        message = texts["r2"]
        assert message.type == "succeeded" and message.message.content[0].type == "text"
        assert message.message.content[0].text == "echo: hello 2"
        deleted = client.messages.batches.delete(ids[0])
        assert deleted.type == "message_batch_deleted"
        with pytest.raises(anthropic.NotFoundError):
            client.messages.batches.retrieve(ids[0])


def test_anthropic_validation_and_limits(emu: EmulatorHandle) -> None:
    client = claude(emu)
    bad_ids = ["has space", "x" * 65, ""]
    for custom_id in bad_ids:
        request: Any = {**claude_requests(1)[0], "custom_id": custom_id}
        with pytest.raises(anthropic.BadRequestError, match="custom_id"):
            client.messages.batches.create(requests=[request])
    twice = claude_requests(2)
    twice[1]["custom_id"] = twice[0]["custom_id"]
    with pytest.raises(anthropic.BadRequestError, match="Duplicate"):
        client.messages.batches.create(requests=twice)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.create(requests=[])
    with running_emulator(EmulatorConfig(batch_max_requests=2, batch_max_bytes=2000)) as small:
        limited = claude(small)
        assert limited.messages.batches.create(requests=claude_requests(2)).id
        with pytest.raises(anthropic.BadRequestError, match="at most 2"):
            limited.messages.batches.create(requests=claude_requests(3))
        huge = claude_requests(1)
        huge[0]["params"]["system"] = "x" * 3000
        with pytest.raises(anthropic.APIStatusError) as info:
            limited.messages.batches.create(requests=huge)
        assert info.value.status_code == 413


def test_anthropic_batch_failure_errors_every_request() -> None:
    with running_emulator(EmulatorConfig(batch_failure_rate=1.0)) as emu:
        client = claude(emu)
        batch = client.messages.batches.create(requests=claude_requests(5))
        ended = claude_ended(client, batch.id)
        results = list(client.messages.batches.results(batch.id))
    assert ended.request_counts.errored == 5
    assert {r.result.type for r in results} == {"errored"}
    assert {r.result.error.error.type for r in results if r.result.type == "errored"} == {
        "api_error"
    }


# -- Gemini -----------------------------------------------------------------------------------


def test_gemini_inline_batch_through_the_sdk(emu: EmulatorHandle) -> None:
    client = gemini(emu)
    requests = gemini_requests(3)
    requests[2]["config"] = {"response_mime_type": "application/json", "response_schema": Answer}
    job = client.batches.create(
        model="gemini-2.5-flash", src=requests, config={"display_name": "inline-job"}
    )
    assert job.name and job.name.startswith("batches/") and job.state == JOB.JOB_STATE_PENDING
    assert job.display_name == "inline-job" and job.model == "models/gemini-2.5-flash"
    final = gemini_final(client, job.name)
    assert final.state == JOB.JOB_STATE_SUCCEEDED and final.end_time is not None
    assert final.dest is not None and final.dest.inlined_responses
    responses = final.dest.inlined_responses
    assert [r.metadata for r in responses] == [{"key": "k0"}, {"key": "k1"}, {"key": "k2"}]
    assert responses[1].response is not None and responses[1].response.text == "echo: item 1"
    assert responses[2].response is not None
    Answer.model_validate_json(responses[2].response.text or "")


def test_gemini_operation_wire_shape_and_snake_case(emu: EmulatorHandle) -> None:
    body = {
        "batch": {
            "display_name": "snake",
            "input_config": {
                "requests": {
                    "requests": [
                        {
                            "request": {"contents": [{"parts": [{"text": "a"}]}]},
                            "metadata": {"key": "x"},
                        },
                        {"request": {"contents": []}, "metadata": {"key": "bad"}},
                    ]
                }
            },
        }
    }
    created = raw(emu, "/v1beta/models/gemini-2.5-flash:batchGenerateContent", body, "POST")
    assert created["metadata"]["state"] == "BATCH_STATE_PENDING" and "done" not in created
    name = created["name"]
    op = wait_for(lambda: raw(emu, f"/v1beta/{name}"), lambda o: o.get("done", False))
    meta = op["metadata"]
    assert meta["@type"].endswith("GenerateContentBatch") and meta["name"] == name
    assert meta["state"] == "BATCH_STATE_SUCCEEDED" and meta["displayName"] == "snake"
    assert meta["batchStats"] == {
        "requestCount": "2",
        "successfulRequestCount": "1",
        "failedRequestCount": "1",
        "pendingRequestCount": "0",
    }
    assert op["response"]["@type"].endswith("GenerateContentBatchOutput")
    inlined = op["response"]["inlinedResponses"]["inlinedResponses"]
    assert meta["output"]["inlinedResponses"]["inlinedResponses"] == inlined
    assert inlined[0]["metadata"] == {"key": "x"} and inlined[0]["response"]["candidates"]
    assert inlined[1]["error"]["code"] == 3 and inlined[1]["error"]["details"] == []


def test_gemini_file_batch_upload_and_download(emu: EmulatorHandle, tmp_path: Path) -> None:
    client = gemini(emu)
    filler = "y" * 100_000  # 90 lines of 100 KB: more than the SDK's 8 MB upload chunk
    lines = [
        {"key": f"line-{i}", "request": {"contents": [{"parts": [{"text": f"{i} {filler}"}]}]}}
        for i in range(90)
    ]
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(lines))
    uploaded = client.files.upload(
        file=path, config={"mime_type": "application/jsonl", "display_name": "reqs"}
    )
    assert uploaded.name and uploaded.name.startswith("files/")
    assert uploaded.size_bytes == path.stat().st_size and uploaded.state == "ACTIVE"
    assert client.files.get(name=uploaded.name).display_name == "reqs"
    job = client.batches.create(model="gemini-2.5-flash", src=uploaded.name)
    final = gemini_final(client, job.name or "")
    assert final.state == JOB.JOB_STATE_SUCCEEDED
    assert final.dest is not None and final.dest.file_name
    results = parse_jsonl(client.files.download(file=final.dest.file_name))
    assert [r["key"] for r in results] == [f"line-{i}" for i in range(90)]  # input order
    text = results[7]["response"]["candidates"][0]["content"]["parts"][0]["text"]
    assert text.startswith("echo: 7 yyy")
    # The documented download path serves the same bytes.
    url = f"{emu.url}/download/v1beta/{final.dest.file_name}:download?alt=media&key={KEY}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert parse_jsonl(reply.read()) == results


def test_gemini_cancel_expire_fail() -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=3.0)) as emu:
        client = gemini(emu)
        job = client.batches.create(model="gemini-2.5-flash", src=gemini_requests(40))
        time.sleep(0.3)
        client.batches.cancel(name=job.name or "")
        final = gemini_final(client, job.name or "")
        assert final.state == JOB.JOB_STATE_CANCELLED
        assert final.dest is not None and final.dest.inlined_responses
        kept = [r.metadata["key"] for r in final.dest.inlined_responses if r.metadata]
        assert 0 < len(kept) < 40 and kept == [f"k{i}" for i in range(len(kept))]
    with running_emulator(EmulatorConfig(batch_expire_rate=1.0)) as emu:
        client = gemini(emu)
        job = client.batches.create(model="gemini-2.5-flash", src=gemini_requests(4))
        final = gemini_final(client, job.name or "")
        assert final.state == JOB.JOB_STATE_EXPIRED and final.dest is None  # no results
    with running_emulator(EmulatorConfig(batch_failure_rate=1.0)) as emu:
        client = gemini(emu)  # kept: a collected genai.Client closes its connection pool
        job = client.batches.create(model="gemini-2.5-flash", src=gemini_requests(2))
        assert job.name
        op = wait_for(lambda: raw(emu, f"/v1beta/{job.name}"), lambda o: o.get("done", False))
        assert op["metadata"]["state"] == "BATCH_STATE_FAILED"
        assert op["error"]["code"] == 13 and op["error"]["message"] and "response" not in op


def test_gemini_list_delete_and_inline_limit() -> None:
    with running_emulator(EmulatorConfig(batch_max_bytes=4000)) as emu:
        client = gemini(emu)
        names = [
            client.batches.create(model="gemini-2.5-flash", src=gemini_requests(2)).name
            for _ in range(3)
        ]
        listed = [job.name for job in client.batches.list(config={"page_size": 2})]
        assert listed == names[::-1]
        client.batches.delete(name=names[0] or "")
        with pytest.raises(genai_errors.ClientError) as missing:
            client.batches.get(name=names[0] or "")
        assert missing.value.code == 404
        with pytest.raises(genai_errors.ClientError) as too_big:
            client.batches.create(model="gemini-2.5-flash", src=gemini_requests(60))
        assert too_big.value.code == 400 and too_big.value.status == "INVALID_ARGUMENT"


# -- across providers -----------------------------------------------------------------------


def test_item_errors_in_each_providers_shape() -> None:
    with running_emulator(EmulatorConfig(batch_item_error_rate=0.5, seed=8)) as emu:
        claude_client = claude(emu)
        batch = claude_client.messages.batches.create(requests=claude_requests(40))
        claude_ended(claude_client, batch.id)
        kinds = {
            r.result.error.error.type
            for r in claude_client.messages.batches.results(batch.id)
            if r.result.type == "errored"
        }
        client = gemini(emu)
        job = client.batches.create(model="gemini-2.5-flash", src=gemini_requests(40))
        final = gemini_final(client, job.name or "")
    assert kinds == {"api_error", "invalid_request_error"}
    assert final.dest is not None and final.dest.inlined_responses
    codes = {r.error.code for r in final.dest.inlined_responses if r.error}
    assert codes == {13, 3}


def test_results_are_shuffled_the_same_way_for_a_seed() -> None:
    def orders() -> tuple[list[str], list[str]]:
        with running_emulator(EmulatorConfig(seed=21)) as emu:
            client = oai(emu)
            batch = openai_final(client, openai_batch(client, [chat_line(i) for i in range(50)]).id)
            assert batch.output_file_id
            content = client.files.content(batch.output_file_id).content
            claude_client = claude(emu)
            message_batch = claude_client.messages.batches.create(requests=claude_requests(50))
            claude_ended(claude_client, message_batch.id)
            results = claude_client.messages.batches.results(message_batch.id)
            return [r["custom_id"] for r in parse_jsonl(content)], [r.custom_id for r in results]

    first, again = orders(), orders()
    assert first == again
    assert first[0] != [f"req-{i}" for i in range(50)] and sorted(first[0]) == sorted(
        f"req-{i}" for i in range(50)
    )
    assert first[1] != [f"r{i}" for i in range(50)]


def test_a_restarted_client_finds_its_batches(emu: EmulatorHandle) -> None:
    submitter = oai(emu)
    batch_id = openai_batch(submitter, [chat_line(i) for i in range(3)]).id
    claude_id = claude(emu).messages.batches.create(requests=claude_requests(2)).id
    first_gemini = gemini(emu)
    gemini_name = first_gemini.batches.create(model="gemini-2.5-flash", src=gemini_requests(2)).name
    submitter.close()
    del submitter, first_gemini
    # A new process would build new clients from the saved ids alone.
    batch = openai_final(oai(emu), batch_id)
    assert batch.output_file_id
    assert len(parse_jsonl(oai(emu).files.content(batch.output_file_id).content)) == 3
    fresh = claude(emu)
    claude_ended(fresh, claude_id)
    assert len(list(fresh.messages.batches.results(claude_id))) == 2
    fresh_gemini = gemini(emu)
    final = gemini_final(fresh_gemini, gemini_name or "")
    assert final.dest is not None and len(final.dest.inlined_responses or []) == 2


def test_stats_count_batch_calls_and_jobs() -> None:
    with running_emulator() as emu:
        openai_final(oai(emu), openai_batch(oai(emu), [chat_line(0)]).id)
        claude(emu).messages.batches.create(requests=claude_requests(1))
        client = gemini(emu)
        client.batches.create(model="gemini-2.5-flash", src=gemini_requests(1))
        stats = emu.stats()
    assert stats["batches"] == {"openai": 1, "anthropic": 1, "gemini": 1}
    assert stats["families"]["openai"] >= 3  # upload, create, retrieve
    assert stats["families"]["anthropic"] == 1 and stats["families"]["gemini"] == 1
    assert stats["status"] == {"200": stats["requests"]}


def test_files_live_in_a_temporary_directory_removed_at_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A temp root of this test's own: emulators of other tests (xdist workers) come and go too.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    pattern = os.path.join(tempfile.gettempdir(), "llm-kit-emulator-*")
    before = set(glob.glob(pattern))
    with running_emulator() as emu:
        client = oai(emu)
        batch = openai_final(client, openai_batch(client, [chat_line(i) for i in range(5)]).id)
        ours = set(glob.glob(pattern)) - before
        assert len(ours) == 1
        stored = os.listdir(ours.pop())
        assert batch.status == "completed" and len(stored) >= 2  # the upload and the output
        directory = set(glob.glob(pattern)) - before
    assert not any(os.path.exists(path) for path in directory)


def test_polls_stay_responsive_while_a_large_batch_runs() -> None:
    with running_emulator(subprocess=True) as emu:
        client = oai(emu)
        batch = openai_batch(client, [chat_line(i) for i in range(20_000)])
        midway: list[int] = []  # completed counts that polls saw while the job ran
        while batch.status != "completed":
            batch = client.batches.retrieve(batch.id)
            done = batch.request_counts.completed if batch.request_counts else 0
            if batch.status != "completed" and 0 < done < 20_000:
                midway.append(done)
            time.sleep(0.01)
    assert batch.request_counts is not None and batch.request_counts.completed == 20_000
    # Polls were answered between the runner's steps, not held until the job ended (no clock
    # involved: a loaded machine slows both sides alike).
    assert len(midway) >= 2 and midway == sorted(midway), midway


# -- command lines --------------------------------------------------------------------------


BATCH_FLAGS = [
    "--batch-delay=0.5",
    "--batch-failure-rate=0.2",
    "--batch-expire-rate=0.3",
    "--batch-expire-done-fraction=0.25",
    "--batch-item-error-rate=0.1",
    "--batch-max-requests=7",
    "--batch-max-bytes=9000",
]


def test_python_m_emulator_batch_flags() -> None:
    options = vars(_parser().parse_args(BATCH_FLAGS))
    options.pop("host"), options.pop("port")
    config = EmulatorConfig.from_options(**options)
    assert (config.batch_delay_s, config.batch_failure_rate, config.batch_expire_rate) == (
        0.5,
        0.2,
        0.3,
    )
    assert config.batch_expire_done_fraction == 0.25 and config.batch_item_error_rate == 0.1
    assert (config.batch_max_requests, config.batch_max_bytes) == (7, 9000)
    rebuilt = vars(_parser().parse_args(config.to_argv()))
    rebuilt.pop("host"), rebuilt.pop("port")
    assert EmulatorConfig.from_options(**rebuilt) == config
    with pytest.raises(ValueError, match="more than 1"):
        EmulatorConfig(batch_failure_rate=0.6, batch_expire_rate=0.6)
    # The flags reach a real emulator process (through to_argv).
    with running_emulator(EmulatorConfig(batch_failure_rate=1.0), subprocess=True) as emu:
        client = oai(emu)
        assert openai_final(client, openai_batch(client, [chat_line(0)]).id).status == "failed"


def _mmirage_has_batch_flags() -> bool:
    return "--batch-delay" in CliRunner().invoke(mmirage_main, ["emulate", "--help"]).output


@pytest.mark.skipif(
    not _mmirage_has_batch_flags(), reason="src/mmirage/cli.py does not declare the batch flags yet"
)
def test_mmirage_emulate_batch_flags() -> None:
    runner = CliRunner()
    assert runner.invoke(mmirage_main, ["emulate", "--batch-failure-rate", "2"]).exit_code == 2
    assert runner.invoke(mmirage_main, ["emulate", "--batch-max-requests", "0"]).exit_code == 2
    script = Path(sys.executable).with_name("mmirage")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "mmirage.cli"]
    process = subprocess.Popen(
        [*command, "emulate", "--port", "0", "--batch-failure-rate", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().split("OpenAI ", 1)[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        assert openai_final(client, openai_batch(client, [chat_line(0)]).id).status == "failed"
    finally:
        process.terminate()
        process.wait(timeout=15)


def test_bytes_io_upload_and_file_list(emu: EmulatorHandle) -> None:
    client = gemini(emu)
    uploaded = client.files.upload(
        file=io.BytesIO(b'{"key": "a", "request": {"contents": [{"parts": [{"text": "hi"}]}]}}\n'),
        config={"mime_type": "application/jsonl"},
    )
    assert uploaded.name in {f.name for f in client.files.list()}
    client.files.delete(name=uploaded.name or "")
    with pytest.raises(genai_errors.ClientError):
        client.files.get(name=uploaded.name or "")
