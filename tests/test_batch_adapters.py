"""The built-in batch adapters (openai, anthropic, gemini) over real HTTP to the emulator: request
shapes, the whole lifecycle, per-item errors, expired, failed and canceled batches, credentials,
and the official SDKs reading what the adapters created."""

from __future__ import annotations

import base64
import logging
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson
import pytest

from llm_kit.errors import ProviderError
from llm_kit.providers import get_codec
from llm_kit.providers.anthropic_batch import AnthropicBatchBackend
from llm_kit.providers.gemini_batch import GeminiBatchBackend
from llm_kit.providers.openai_batch import OpenAIBatchBackend
from llm_kit.schema import schema_from_dict
from llm_kit.transport import HttpTransport
from llm_kit.types import Message
from mmirage.config.batch_provider import (
    AnthropicBatchConfig,
    BatchProviderConfig,
    GeminiBatchConfig,
    OpenAIBatchConfig,
)
from mmirage.core.process.batch.adapter import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    UNKNOWN,
    BatchSubmissionAdapter,
    BatchSubmissionResult,
    MissingCredentialsError,
)
from mmirage.core.process.batch.adapters import BatchNotReadyError
from mmirage.core.process.batch.adapters.anthropic import AnthropicBatchAdapter
from mmirage.core.process.batch.adapters.gemini import GeminiBatchAdapter
from mmirage.core.process.batch.adapters.openai import OpenAIBatchAdapter
from mmirage.core.process.batch.registry import BatchAdapterRegistry
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle

KEY = "sk-adapter-secret-5150-do-not-leak"
PROVIDERS = ["openai", "anthropic", "gemini"]
ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
SCHEMA = {
    "type": "object",
    "properties": {"question": {"type": "string"}, "answer": {"type": "string"}},
    "required": ["question", "answer"],
}
PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()
BMP = "data:image/bmp;base64," + base64.b64encode(b"BM" + b"\0" * 16).decode()
PHOTO_URL = "https://example.com/photo.jpg"
# The providers' own words for a batch that ended normally, and for a canceled one.
ENDED_WORD = {"openai": "completed", "anthropic": "ended", "gemini": "BATCH_STATE_SUCCEEDED"}
CANCELED_WORD = {"openai": "cancelled", "anthropic": "ended", "gemini": "BATCH_STATE_CANCELLED"}


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorHandle]:
    with running_emulator(EmulatorConfig(seed=7)) as handle:
        yield handle


@pytest.fixture(autouse=True)
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV.values():
        monkeypatch.setenv(name, KEY)


# -- helpers -------------------------------------------------------------------------------------


def config_for(provider: str, emu: EmulatorHandle | None = None, **fields: Any) -> Any:
    if provider == "openai":
        url = emu.openai_base_url if emu else None
        return OpenAIBatchConfig(model="gpt-4o-mini", base_url=url, **fields)
    if provider == "anthropic":
        return AnthropicBatchConfig(base_url=emu.anthropic_base_url if emu else None, **fields)
    return GeminiBatchConfig(base_url=emu.gemini_base_url if emu else None, **fields)


def adapter_for(config: BatchProviderConfig) -> BatchSubmissionAdapter:
    return BatchAdapterRegistry.create(config)


def payload(
    text: str, schema: dict[str, Any] | None = None, images: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The processor's neutral payload (reference §4.3)."""
    content: Any = text
    if images:
        content = [{"type": "text", "text": text}] + [
            {"type": "image_url", "image_url": {"url": url}} for url in images
        ]
    built: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "response_schema": schema,
    }
    if schema:
        built["expected_schema"] = list(schema["properties"])
    return built


def requests_for(
    adapter: BatchSubmissionAdapter, config: BatchProviderConfig, count: int
) -> list[dict[str, Any]]:
    return [
        adapter.build_request(
            f"answer-text-{n}", payload(f"question {n}", SCHEMA if n % 3 == 0 else None), config
        )
        for n in range(1, count + 1)
    ]


def wait_terminal(
    adapter: BatchSubmissionAdapter,
    batch_id: str,
    config: BatchProviderConfig,
    timeout_s: float = 15.0,
) -> BatchSubmissionResult:
    deadline = time.monotonic() + timeout_s
    while True:
        result = adapter.check_batch_status(batch_id, config)
        if result.is_terminal or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


def submit(
    adapter: BatchSubmissionAdapter, config: BatchProviderConfig, count: int
) -> tuple[dict[str, Any], BatchSubmissionResult]:
    raw = adapter.submit_chunk("chunk-000001", requests_for(adapter, config, count), config)
    return raw, adapter.parse_submission_result(raw)


def llm_kit_line(backend: Any, custom_id: str, body: dict[str, Any]) -> bytes:
    return bytes(backend.line(custom_id, body))


def offline(cls: Any, **options: Any) -> Any:
    transport = HttpTransport(
        "http://unused", {}, max_connections=1, request_timeout=1, connect_timeout=1
    )
    return cls(get_codec(cls.name), transport, options.pop("model", "m"), **options)


# -- build_request ---------------------------------------------------------------------------------


def test_openai_request_line_is_llm_kits_byte_for_byte() -> None:
    config = config_for(
        "openai",
        temperature=0.2,
        top_p=0.9,
        max_completion_tokens=64,
        seed=7,
        batch_endpoint="/v1/chat/completions",
    )
    adapter = adapter_for(config)
    request = adapter.build_request("answer-text-1", payload("Q?", SCHEMA), config)
    assert request["custom_id"] == "answer-text-1"
    assert (request["method"], request["url"]) == ("POST", "/v1/chat/completions")
    body = request["body"]
    assert body["model"] == "gpt-4o-mini"
    assert body["messages"] == [{"role": "user", "content": "Q?"}]
    assert (body["temperature"], body["top_p"], body["max_completion_tokens"], body["seed"]) == (
        0.2,
        0.9,
        64,
        7,
    )
    assert "max_tokens" not in body  # unset fields leave the provider's default
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "structured_output"
    assert fmt["json_schema"]["strict"] is True
    assert fmt["json_schema"]["schema"]["additionalProperties"] is False
    # The same bytes as llm_kit's own batch line for the same message, sampling and schema.
    sampling = {"temperature": 0.2, "top_p": 0.9, "max_completion_tokens": 64, "seed": 7}
    expected_body = get_codec("openai").encode(
        "gpt-4o-mini",
        [Message.user("Q?")],
        sampling,
        schema_from_dict("structured_output", SCHEMA),
    )
    line = llm_kit_line(offline(OpenAIBatchBackend), "answer-text-1", expected_body)
    assert orjson.dumps(request) + b"\n" == line
    assert adapter.estimate_request_bytes(request) == len(line) - 1


def test_openai_request_options() -> None:
    config = config_for("openai", max_tokens=10, batch_endpoint="/v1/completions")
    adapter = adapter_for(config)
    optional = {**SCHEMA, "required": ["question"]}  # not strict-able: strict is off
    request = adapter.build_request("a-text-2", payload("Q?", optional), config)
    assert request["url"] == "/v1/completions" and request["body"]["max_tokens"] == 10
    assert request["body"]["response_format"]["json_schema"]["strict"] is False
    plain = adapter.build_request("a-text-3", payload("Q?"), config)
    assert "response_format" not in plain["body"] and "temperature" not in plain["body"]
    # Images: an http(s) URL and a data: URL are sent as they are (OpenAI fetches or decodes).
    multimodal = adapter.build_request(
        "a-multimodal-4", payload("Look", images=(PHOTO_URL, BMP)), config
    )
    content = multimodal["body"]["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "Look"},
        {"type": "image_url", "image_url": {"url": PHOTO_URL}},
        {"type": "image_url", "image_url": {"url": BMP}},
    ]


def test_anthropic_request_shape_and_images() -> None:
    config = config_for("anthropic", max_tokens=256, temperature=0.3)
    adapter = adapter_for(config)
    request = adapter.build_request(
        "answer-multimodal-1", payload("Describe", SCHEMA, (PHOTO_URL, PNG)), config
    )
    params = request["params"]
    assert request["custom_id"] == "answer-multimodal-1"
    assert (params["model"], params["max_tokens"], params["temperature"]) == (
        "claude-haiku-4-5",
        256,
        0.3,
    )
    assert "top_p" not in params
    assert params["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Describe"},
                {"type": "image", "source": {"type": "url", "url": PHOTO_URL}},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": PNG.split(",", 1)[1],
                    },
                },
            ],
        }
    ]
    assert params["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    body = get_codec("anthropic").encode(
        "claude-haiku-4-5",
        [Message.coerce(payload("Describe", images=(PHOTO_URL, PNG))["messages"][0])],
        {"max_tokens": 256, "temperature": 0.3},
        schema_from_dict("structured_output", SCHEMA),
    )
    line = llm_kit_line(offline(AnthropicBatchBackend), "answer-multimodal-1", body)
    assert orjson.dumps(request) + b"\n" == line
    # top_p instead of temperature; a text prompt stays a plain string.
    nucleus = config_for("anthropic", top_p=0.5)
    plain = adapter.build_request("answer-text-2", payload("Hi"), nucleus)["params"]
    assert plain["top_p"] == 0.5 and "temperature" not in plain and plain["max_tokens"] == 8192
    assert plain["messages"] == [{"role": "user", "content": "Hi"}]
    assert "output_config" not in plain


def test_anthropic_refuses_other_image_types_before_any_http(
    emu: EmulatorHandle, tmp_path: Path
) -> None:
    config = config_for("anthropic", emu)
    adapter = adapter_for(config)
    tiff = tmp_path / "scan.tiff"
    tiff.write_bytes(b"II*\0" + b"\0" * 32)
    before = emu.stats()["requests"]
    with pytest.raises(ValueError, match=r"answer-multimodal-5.*image/bmp"):
        adapter.build_request("answer-multimodal-5", payload("x", images=(BMP,)), config)
    with pytest.raises(ValueError, match=r"answer-multimodal-6.*image/tiff"):
        adapter.build_request("answer-multimodal-6", payload("x", images=(str(tiff),)), config)
    with pytest.raises(ValueError, match=r"custom_ids must match"):
        adapter.build_request("answer.v2-text-1", payload("x"), config)
    assert emu.stats()["requests"] == before


def test_gemini_request_shape() -> None:
    config = config_for(
        "gemini", temperature=0.4, top_p=0.8, top_k=20, max_output_tokens=50, seed=3
    )
    adapter = adapter_for(config)
    request = adapter.build_request(
        "answer-multimodal-1", payload("Look", SCHEMA, (PNG, PHOTO_URL)), config
    )
    assert request["key"] == "answer-multimodal-1"
    body = request["request"]
    assert body["contents"] == [
        {
            "role": "user",
            "parts": [
                {"text": "Look"},
                {"inlineData": {"mimeType": "image/png", "data": PNG.split(",", 1)[1]}},
                {"fileData": {"mimeType": "image/jpeg", "fileUri": PHOTO_URL}},
            ],
        }
    ]
    assert body["generationConfig"] == {
        "temperature": 0.4,
        "topP": 0.8,
        "topK": 20,
        "maxOutputTokens": 50,
        "seed": 3,
        "responseMimeType": "application/json",
        "responseJsonSchema": SCHEMA,
    }
    plain = adapter.build_request("answer-text-2", payload("Hi"), config_for("gemini"))
    assert plain == {
        "key": "answer-text-2",
        "request": {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]},
    }
    line = llm_kit_line(offline(GeminiBatchBackend), "answer-text-2", plain["request"])
    assert orjson.dumps(plain) + b"\n" == line
    assert adapter.estimate_request_bytes(plain) == len(line) - 1


def test_a_payload_without_messages_names_the_request() -> None:
    config = config_for("openai")
    with pytest.raises(ValueError, match=r"request answer-text-9: the payload has no 'messages'"):
        adapter_for(config).build_request("answer-text-9", {"response_schema": None}, config)


def test_an_adapter_refuses_another_providers_config() -> None:
    with pytest.raises(TypeError, match="needs a OpenAIBatchConfig, got AnthropicBatchConfig"):
        OpenAIBatchAdapter({"api_key": KEY}).build_request(
            "a-text-1", payload("x"), AnthropicBatchConfig()
        )


# -- lifecycle -------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_submit_check_retrieve(emu: EmulatorHandle, provider: str) -> None:
    config = config_for(provider, emu)
    adapter = adapter_for(config)
    raw, submitted = submit(adapter, config, 6)
    assert raw["chunk_id"] == "chunk-000001" and raw["id"] == submitted.provider_batch_id
    assert raw["status"] == submitted.provider_status
    assert submitted.status == IN_PROGRESS and not submitted.is_terminal
    orjson.dumps(raw)  # plain JSON, as a receipt stores it
    if provider == "openai":
        assert raw["input_file_id"].startswith("file-")
        assert raw["metadata"] == {"chunk_id": "chunk-000001"}
        assert submitted.provider_status == "validating"
    if provider == "anthropic":
        assert submitted.provider_status == "in_progress"
        assert submitted.request_counts["processing"] == 6
    if provider == "gemini":
        assert submitted.provider_batch_id.startswith("batches/")
        assert submitted.provider_status == "BATCH_STATE_PENDING"

    final = wait_terminal(adapter, submitted.provider_batch_id, config)
    assert final.status == COMPLETED
    assert final.provider_status == ENDED_WORD[provider]
    assert final.request_counts == {
        "total": 6,
        "succeeded": 6,
        "errored": 0,
        "expired": 0,
        "canceled": 0,
        "processing": 0,
        "answered": 6,
    }
    rows = {
        row["custom_id"]: row for row in adapter.retrieve_results(final.provider_batch_id, config)
    }
    assert set(rows) == {f"answer-text-{n}" for n in range(1, 7)}
    assert rows["answer-text-2"]["status"] == "succeeded"
    assert rows["answer-text-2"]["generated_text"] == "echo: question 2"
    assert orjson.loads(rows["answer-text-3"]["generated_text"]).keys() == {"question", "answer"}
    for row in rows.values():
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0
        assert "error_message" not in row


@pytest.mark.parametrize("provider", PROVIDERS)
def test_per_item_errors_become_error_rows(provider: str) -> None:
    with running_emulator(EmulatorConfig(batch_item_error_rate=0.5, seed=8)) as emu:
        config = config_for(provider, emu)
        adapter = adapter_for(config)
        _, submitted = submit(adapter, config, 12)
        final = wait_terminal(adapter, submitted.provider_batch_id, config)
        rows = adapter.retrieve_results(final.provider_batch_id, config)
    assert final.status == COMPLETED
    assert len(rows) == 12 and len({r["custom_id"] for r in rows}) == 12
    errors = [r for r in rows if r["status"] == "error"]
    assert 0 < len(errors) == final.request_counts["errored"] < 12
    for row in errors:
        assert row["error_message"] and isinstance(row["retryable"], bool)
        assert "generated_text" not in row and "input_tokens" not in row
    kinds = {r["error_kind"] for r in errors}
    expected = {
        "openai": {"server_error", "invalid_request_error"},
        "anthropic": {"api_error", "invalid_request_error"},
        "gemini": {"grpc_13", "grpc_3"},
    }[provider]
    assert kinds <= expected
    # Server errors are worth another try; an invalid request is not.
    for row in errors:
        assert row["retryable"] is (row["error_kind"] in ("server_error", "api_error", "grpc_13"))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_expired_batch_keeps_its_partial_results(provider: str) -> None:
    with running_emulator(EmulatorConfig(batch_expire_rate=1.0, seed=2)) as emu:
        config = config_for(provider, emu)
        adapter = adapter_for(config)
        _, submitted = submit(adapter, config, 10)
        final = wait_terminal(adapter, submitted.provider_batch_id, config)
        rows = adapter.retrieve_results(final.provider_batch_id, config)
    succeeded = [r for r in rows if r["status"] == "succeeded"]
    expired = [r for r in rows if r.get("error_kind") == "expired"]
    if provider == "gemini":
        # An expired Gemini batch has no results at all (provider-wire-formats §3.2).
        assert final.provider_status == "BATCH_STATE_EXPIRED" and final.status == FAILED
        assert rows == [] and final.request_counts["expired"] == 10
        return
    assert len(succeeded) == 5 and len(expired) == 5  # batch_expire_done_fraction 0.5
    assert all(r["retryable"] is True and r["error_message"] for r in expired)
    if provider == "openai":
        assert (final.provider_status, final.status) == ("expired", FAILED)
        # OpenAI counts only completed and failed requests: the expired ones are "failed".
        assert final.request_counts["errored"] == 5
    else:  # ended with successes: completed, its expired requests come back as errors
        assert (final.provider_status, final.status) == ("ended", COMPLETED)
        assert final.request_counts["expired"] == 5


@pytest.mark.parametrize("provider", PROVIDERS)
def test_whole_batch_failure(provider: str) -> None:
    with running_emulator(EmulatorConfig(batch_failure_rate=1.0)) as emu:
        config = config_for(provider, emu)
        adapter = adapter_for(config)
        _, submitted = submit(adapter, config, 3)
        final = wait_terminal(adapter, submitted.provider_batch_id, config)
        rows = adapter.retrieve_results(final.provider_batch_id, config)
    assert final.status == FAILED
    if provider == "anthropic":  # Anthropic has no failed batch: every request errors
        assert final.provider_status == "ended" and final.request_counts["errored"] == 3
        assert [r["status"] for r in rows] == ["error"] * 3
    else:
        assert final.provider_status in ("failed", "BATCH_STATE_FAILED")
        assert rows == []


@pytest.mark.parametrize("provider", PROVIDERS)
def test_cancel(provider: str) -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=3.0, seed=4)) as emu:
        config = config_for(provider, emu)
        adapter = adapter_for(config)
        _, submitted = submit(adapter, config, 20)
        time.sleep(0.3)
        adapter.cancel_batch(submitted.provider_batch_id, config)
        final = wait_terminal(adapter, submitted.provider_batch_id, config)
        rows = adapter.retrieve_results(final.provider_batch_id, config)
    assert final.provider_status == CANCELED_WORD[provider]
    canceled = [r for r in rows if r.get("error_kind") == "canceled"]
    succeeded = [r for r in rows if r["status"] == "succeeded"]
    if provider == "gemini":  # Gemini returns only the finished requests
        assert final.status == FAILED and 0 < len(succeeded) < 20 and not canceled
        return
    assert len(canceled) + len(succeeded) == 20 and canceled
    # OpenAI counts the requests its cancel stopped as failed.
    counted = "errored" if provider == "openai" else "canceled"
    assert final.request_counts[counted] == len(canceled)
    assert final.status == (COMPLETED if provider == "anthropic" and succeeded else FAILED)


def test_results_of_a_running_batch_are_refused() -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=30)) as emu:
        config = config_for("openai", emu)
        adapter = adapter_for(config)
        _, submitted = submit(adapter, config, 2)
        batch_id = submitted.provider_batch_id
        with pytest.raises(
            BatchNotReadyError, match=rf"batch {batch_id} has not ended yet"
        ) as info:
            adapter.retrieve_results(batch_id, config)
        assert info.value.batch_id == batch_id and info.value.status in (
            "validating",
            "in_progress",
        )
        adapter.cancel_batch(batch_id, config)


def test_an_unknown_status_word_is_unknown_not_a_guess() -> None:
    cases: list[tuple[BatchSubmissionAdapter, dict[str, Any]]] = [
        (OpenAIBatchAdapter(), {"id": "batch_1", "status": "paused"}),
        (AnthropicBatchAdapter(), {"id": "msgbatch_1", "processing_status": "archived"}),
        (GeminiBatchAdapter(), {"name": "batches/1", "metadata": {"state": "BATCH_STATE_X"}}),
    ]
    for adapter, raw in cases:
        raw.setdefault("id", raw.get("name"))
        assert adapter.parse_submission_result(raw).status == UNKNOWN


def test_anthropic_ended_with_nothing_done_is_failed() -> None:
    adapter = AnthropicBatchAdapter()
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 4, "expired": 0}
    ended = {"id": "msgbatch_2", "processing_status": "ended", "request_counts": counts}
    result = adapter.parse_submission_result(ended)
    assert (result.status, result.provider_status) == (FAILED, "ended")
    assert result.request_counts["canceled"] == 4 and result.request_counts["total"] == 4


def test_anthropic_timeout_seconds_is_honoured() -> None:
    # A server that accepts connections and never answers.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        config = AnthropicBatchConfig(base_url=f"http://127.0.0.1:{port}", timeout_seconds=0.5)
        adapter = adapter_for(config)
        started = time.monotonic()
        with pytest.raises(ProviderError, match=r"within 0.5 s"):
            adapter.check_batch_status("msgbatch_slow", config)
        with pytest.raises(ProviderError, match=r"within 0.5 s"):
            adapter.submit_chunk("chunk-000001", requests_for(adapter, config, 1), config)
        assert time.monotonic() - started < 5


# -- credentials -----------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
def test_missing_key(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV[provider])
    config = config_for(provider)
    with pytest.raises(MissingCredentialsError, match=ENV[provider]):
        BatchAdapterRegistry.create(config)
    # A dry run needs none: requests are built, nothing is sent.
    adapter = BatchAdapterRegistry.create(config, allow_missing_credentials=True)
    assert adapter.credentials == {}
    request = adapter.build_request("answer-text-1", payload("Hi"), config)
    with pytest.raises(MissingCredentialsError, match=ENV[provider]):
        adapter.submit_chunk("chunk-000001", [request], config)


def test_the_key_is_in_no_raw_response_file_or_log(
    emu: EmulatorHandle,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    spool = tmp_path / "tmp"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))  # the adapters' spool and downloads
    receipts = tmp_path / "receipts.jsonl"
    for provider in PROVIDERS:
        config = config_for(provider, emu)
        adapter = adapter_for(config)
        assert adapter.credentials == {"api_key": KEY}
        raw, submitted = submit(adapter, config, 3)
        final = wait_terminal(adapter, submitted.provider_batch_id, config)
        rows = adapter.retrieve_results(final.provider_batch_id, config)
        with open(receipts, "ab") as f:
            for value in (raw, submitted.raw_response, final.raw_response, *rows):
                f.write(orjson.dumps(value) + b"\n")
        assert KEY not in repr((raw, submitted, final, rows))
    # The temporary spool files are gone. (The in-thread emulator's own folder may land here
    # too, when this is the first test of its worker to upload a batch to it.)
    left = [path for path in spool.iterdir() if not path.name.startswith("llm-kit-emulator-")]
    assert left == []
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in caplog.text


# -- the official SDKs read what the adapters created ----------------------------------------------


def test_openai_sdk_reads_the_adapters_batch(emu: EmulatorHandle) -> None:
    config = config_for("openai", emu, metadata={"team": "data"})
    adapter = adapter_for(config)
    raw, submitted = submit(adapter, config, 4)
    final = wait_terminal(adapter, submitted.provider_batch_id, config)
    rows = {r["custom_id"]: r for r in adapter.retrieve_results(final.provider_batch_id, config)}

    client = openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)
    batch = client.batches.retrieve(submitted.provider_batch_id)
    assert batch.status == final.provider_status == "completed"
    assert batch.input_file_id == raw["input_file_id"]
    assert batch.endpoint == config.batch_endpoint
    assert batch.metadata == {"team": "data", "chunk_id": "chunk-000001"}
    assert batch.request_counts is not None
    assert batch.request_counts.completed == final.request_counts["succeeded"] == 4
    assert batch.output_file_id is not None
    lines = [
        orjson.loads(x) for x in client.files.content(batch.output_file_id).content.splitlines()
    ]
    assert {line["custom_id"] for line in lines} == set(rows)
    for line in lines:
        completion = openai.types.chat.ChatCompletion.model_validate(line["response"]["body"])
        row = rows[line["custom_id"]]
        assert completion.choices[0].message.content == row["generated_text"]
        assert completion.usage is not None
        assert completion.usage.prompt_tokens == row["input_tokens"]
        assert completion.usage.completion_tokens == row["output_tokens"]
    sent = [
        orjson.loads(x) for x in client.files.content(raw["input_file_id"]).content.splitlines()
    ]
    assert sent == requests_for(adapter, config, 4)  # uploaded exactly as built


def test_anthropic_sdk_reads_the_adapters_batch(emu: EmulatorHandle) -> None:
    config = config_for("anthropic", emu)
    adapter = adapter_for(config)
    _, submitted = submit(adapter, config, 4)
    final = wait_terminal(adapter, submitted.provider_batch_id, config)
    rows = {r["custom_id"]: r for r in adapter.retrieve_results(final.provider_batch_id, config)}

    client = anthropic.Anthropic(base_url=emu.anthropic_base_url, api_key=KEY, max_retries=0)
    batch = client.messages.batches.retrieve(submitted.provider_batch_id)
    assert batch.processing_status == final.provider_status == "ended"
    assert batch.request_counts.succeeded == final.request_counts["succeeded"] == 4
    results = list(client.messages.batches.results(submitted.provider_batch_id))
    assert {r.custom_id for r in results} == set(rows)
    for result in results:
        assert result.result.type == "succeeded"
        message = result.result.message
        row = rows[result.custom_id]
        text = "".join(block.text for block in message.content if block.type == "text")
        assert text == row["generated_text"]
        assert message.usage.input_tokens == row["input_tokens"]
        assert message.usage.output_tokens == row["output_tokens"]
