"""Structured output on every OpenAI-compatible server: ``structured_output`` picks the dialect
(``auto``: learned from the server's refusals and first answers, once per base URL and model),
against the emulator in each ``--dialect`` and against llama-cpp-python's own server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Literal

import orjson
import pytest
from pydantic import BaseModel

from conftest import TEST_KEY
from llama_cpp_server_support import llama_cpp_python_server
from llm_kit import LLM, BatchConfig, BatchItem, BatchResult, ConfigError, Message
from llm_kit.dialect_choice import PROBATION
from llm_kit.dialects import DIALECTS
from llm_kit.providers.openai import OpenAICodec
from llm_kit.schema import response_schema
from mmirage.config.errors import ConfigError as MmirageConfigError
from mmirage.config.processing_params import LLMOutput
from mmirage.config.processors import LLMProcessorConfig
from mmirage.config.validation import build
from mmirage.core.process.base import OutputRequest
from mmirage.core.process.llm_processor import LLMProcessor, build_llm
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.__main__ import _parser
from provider_emulator.config import DIALECTS as SERVER_NAMES
from provider_emulator.dialects import SERVER_DIALECTS

CONCURRENCY = 8


class Ticket(BaseModel):
    label: Literal["bug", "question", "praise"]
    urgent: bool


def tickets(n: int) -> list[BatchItem]:
    return [
        BatchItem(
            id=f"t{i}",
            messages=[Message.user(f"Classify this ticket: the app crashed {i} times")],
            response_model=Ticket,
        )
        for i in range(n)
    ]


def client(base_url: str, structured_output: str = "auto", **config: Any) -> LLM:
    return LLM(
        "test-model",
        base_url=base_url,
        api_key=TEST_KEY,
        max_tokens=48,
        structured_output=structured_output,
        config=BatchConfig(
            **{"worker_concurrency": CONCURRENCY, "retry_base_delay": 0.01, **config}
        ),
    )


async def run_all(llm: LLM, items: list[BatchItem]) -> list[BatchResult]:
    return [result async for result in llm.batch_stream(items)]


@pytest.fixture
def info_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="llm_kit")
    return caplog


def in_use(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("structured ")]


# -- against the emulator, in each server's dialect ---------------------------------------------

AUTO_PICKS = {
    "openai": "json_schema",
    "vllm": "json_schema",
    "vllm_legacy": "json_schema",
    "llama_server": "json_schema",
    "llama_cpp_python": "json_object",
    "ollama": "ollama_format",
    "plain": "prompt",
}


def test_every_server_dialect_is_tested() -> None:
    assert set(AUTO_PICKS) == set(SERVER_NAMES) == set(SERVER_DIALECTS)


@pytest.mark.parametrize(("server", "picked"), AUTO_PICKS.items())
async def test_auto_finds_the_servers_dialect_without_spending_retries(
    server: str, picked: str, info_log: pytest.LogCaptureFixture
) -> None:
    with running_emulator(EmulatorConfig(dialect=server)) as emu:  # type: ignore[arg-type]
        results = await run_all(client(emu.openai_base_url), tickets(40))
        status = emu.stats()["status"]
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert all(isinstance(r.response, Ticket) and r.attempts == 1 for r in results)
    assert in_use(info_log) == [
        f"structured output for test-model at {emu.openai_base_url}: {picked}"
    ]
    # The first refusal (or, where a server ignores a form with a 200, the first PROBATION
    # answers that are not JSON) moves every request on: only those already in flight go
    # again, at most once per dialect given up.
    steps = list(DIALECTS).index(picked)
    wasted = status.pop("200") - 40 + sum(status.values())
    assert 0 <= wasted <= steps * (CONCURRENCY + PROBATION)


async def test_the_learned_dialect_is_kept_for_the_next_client_of_the_server() -> None:
    with running_emulator(EmulatorConfig(dialect="llama_cpp_python")) as emu:
        await run_all(client(emu.openai_base_url), tickets(4))
        emu.reset_stats()
        results = await run_all(client(emu.openai_base_url), tickets(10))
        assert emu.stats()["status"] == {"200": 10}  # no refusal at all this time
    assert all(r.ok for r in results)


@pytest.mark.parametrize(
    ("dialect", "server"),
    [
        ("json_schema", "openai"),
        ("json_object", "llama_cpp_python"),
        ("json_object", "llama_server"),
        ("structured_outputs", "vllm"),
        ("guided_json", "vllm_legacy"),
        ("ollama_format", "ollama"),
        ("prompt", "plain"),
    ],
)
async def test_a_named_dialect_is_sent_as_it_is(dialect: str, server: str) -> None:
    with running_emulator(EmulatorConfig(dialect=server)) as emu:  # type: ignore[arg-type]
        results = await run_all(client(emu.openai_base_url, dialect), tickets(6))
        assert emu.stats()["status"] == {"200": 6}
    assert all(r.ok and isinstance(r.response, Ticket) for r in results)


async def test_a_refused_named_dialect_fails_at_once_not_after_the_retry_budget() -> None:
    # llama-cpp-python answers a request it cannot validate with HTTP 500: not transient.
    with running_emulator(EmulatorConfig(dialect="llama_cpp_python")) as emu:
        results = await run_all(client(emu.openai_base_url, "json_schema"), tickets(5))
        assert emu.stats()["status"] == {"500": 5}  # one request per row, never retried
    for result in results:
        assert not result.ok and not result.retryable and result.attempts == 1
        assert result.error_kind == "invalid_request_error"
        assert "response_format" in (result.error or "")


async def test_an_answer_that_misses_the_schema_is_retried_then_recorded() -> None:
    # In the prompt form only the model holds the answer to the schema; this one's JSON is
    # never a Ticket. (A form that carries the schema would be found ignored instead:
    # test_dialects_per_model.) Room for the echo of the re-ask, which quotes the answer.
    with running_emulator(EmulatorConfig(invalid_json="always")) as emu:
        llm = client(emu.openai_base_url, "prompt", validation_retries=2)
        items = tickets(3)
        for item in items:
            item.sampling = {"max_tokens": 256}
        results = await run_all(llm, items)
    for result in results:
        assert not result.ok and result.error_kind == "validation" and not result.retryable
        assert result.attempts == 3
        assert "does not match Ticket" in (result.error or "")


# -- what each dialect sends, and what counts as a refusal ---------------------------------------


def body_in(dialect: str, system: str | None = None) -> dict[str, Any]:
    messages = (
        [Message.user("hi")] if system is None else [Message.system(system), Message.user("hi")]
    )
    body = OpenAICodec().encode("m", messages, {}, None)
    DIALECTS[dialect].apply(body, response_schema(Ticket))
    return body


def test_each_dialect_puts_the_schema_where_its_server_reads_it() -> None:
    schema = response_schema(Ticket).schema
    assert body_in("json_schema")["response_format"]["type"] == "json_schema"
    assert body_in("json_object")["response_format"] == {"type": "json_object", "schema": schema}
    assert body_in("structured_outputs")["structured_outputs"] == {"json": schema}
    assert body_in("guided_json")["guided_json"] == schema
    assert body_in("ollama_format")["format"] == schema
    assert "response_format" not in body_in("prompt")


def test_the_prompt_dialect_joins_an_existing_system_message() -> None:
    messages = body_in("prompt", system="You triage tickets.")["messages"]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"].startswith("You triage tickets.\n\n")
    schema_line = messages[0]["content"].rsplit("\n", 1)[1]
    assert orjson.loads(schema_line) == response_schema(Ticket).schema
    assert body_in("prompt")["messages"][0]["role"] == "system"


@pytest.mark.parametrize(
    ("dialect", "status", "body", "refused"),
    [
        ("json_schema", 400, b'{"error":{"param":"response_format"}}', True),
        ("json_schema", 422, b'{"detail":[{"loc":["body","response_format","type"]}]}', True),
        ("json_schema", 500, b"1 validation error: ('body', 'response_format', 'type')", True),
        (
            "json_schema",
            400,
            b'{"error":{"message":"Invalid image URL","param":"messages"}}',
            False,
        ),
        ("json_schema", 429, b'{"error":{"message":"slow down on response_format"}}', False),
        ("json_schema", 500, b'{"error":{"message":"server had an error"}}', False),
        ("ollama_format", 400, b"Unrecognized request argument supplied: format", True),
        ("ollama_format", 400, b"see response_format for more information", False),
        ("prompt", 400, b"anything at all about response_format", False),
    ],
)
def test_a_refusal_must_name_the_dialects_field(
    dialect: str, status: int, body: bytes, refused: bool
) -> None:
    assert DIALECTS[dialect].refused(status, body) is refused


def test_a_5xx_that_is_a_request_validation_error_is_not_retryable() -> None:
    codec = OpenAICodec()
    validation = (
        b'{"error":{"message":"1 validation error:\\n  {\'type\': \'literal_error\', '
        b"'loc': ('body', 'response_format', 'type'), 'msg': \\\"Input should be 'text' or "
        b'\'json_object\'\\""},"type":"internal_server_error"}}'
    )
    assert not codec.error(500, {}, validation).retryable
    assert codec.error(500, {}, b'{"error":{"message":"The server had an error"}}').retryable


def test_structured_output_is_checked_when_the_client_is_built() -> None:
    with pytest.raises(ConfigError, match="unknown structured_output 'xml'"):
        LLM("m", base_url="http://127.0.0.1:9/v1", structured_output="xml")
    with pytest.raises(ConfigError, match="OpenAI-compatible servers"):
        LLM("m", "anthropic", api_key=TEST_KEY, structured_output="prompt")


def test_the_emulator_command_line_takes_a_dialect() -> None:
    args = vars(_parser().parse_args(["--dialect", "llama_cpp_python"]))
    assert args["dialect"] == "llama_cpp_python"
    config = EmulatorConfig(dialect="ollama")
    assert "--dialect=ollama" in config.to_argv()
    with pytest.raises(ValueError, match="dialect must be one of"):
        EmulatorConfig(dialect="tgi")  # type: ignore[arg-type]


# -- the mmirage llm processor ------------------------------------------------------------------


def llm_processor_config(**raw: Any) -> LLMProcessorConfig:
    return build(LLMProcessorConfig, {"type": "llm", **raw}, ("processors", 0), "test.yaml")


def test_the_llm_processor_passes_structured_output_and_validation_retries() -> None:
    config = llm_processor_config(
        base_url="http://127.0.0.1:9/v1", model="m", structured_output="guided_json",
        validation_retries=0,
    )  # fmt: skip
    llm = build_llm(config)
    assert llm.structured_output == "guided_json" and llm.config.validation_retries == 0
    assert build_llm(llm_processor_config(base_url="http://x/v1", model="m")).structured_output == (
        "auto"
    )


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"structured_output": "xml"}, "processors[0].structured_output: must be 'auto', "),
        (
            {"structured_output": "prompt", "message_format": "anthropic"},
            "processors[0].structured_output: 'prompt' is for OpenAI-compatible servers",
        ),
    ],
)
def test_a_bad_structured_output_is_one_sentence_naming_the_field(
    raw: dict[str, Any], says: str
) -> None:
    with pytest.raises(MmirageConfigError) as info:
        llm_processor_config(model="m", **raw)
    assert says in str(info.value) and "\n" not in str(info.value)


JSON_OUTPUT = LLMOutput(
    name="ticket",
    prompt="{{ text }}",
    output_type="JSON",
    # Types whose grammar bounds the answer's length: small max_tokens never cut it off.
    output_schema={"urgent": "bool", "replies_needed": "int"},
)


def rows(texts: list[str]) -> list[OutputRequest]:
    return [
        OutputRequest(row_key=f"0::{i}", output_name="ticket", prompt=text, variables={}, row={})
        for i, text in enumerate(texts)
    ]


async def process(base_url: str, texts: list[str]) -> list[Any]:
    config = llm_processor_config(
        base_url=base_url, model="smollm2", worker_concurrency=2,
        default_sampling_params={"max_new_tokens": 48, "temperature": 0.0},
    )  # fmt: skip
    processor = LLMProcessor(config)
    try:
        return await processor.process(JSON_OUTPUT, rows(texts))
    finally:
        await processor.aclose()


async def test_json_rows_succeed_on_the_emulated_llama_cpp_python_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)  # the emulator wants one, as OpenAI does
    with running_emulator(EmulatorConfig(dialect="llama_cpp_python")) as emu:
        results = await process(emu.openai_base_url, [f"ticket {i}" for i in range(12)])
    assert all(r.ok and set(r.value) == {"urgent", "replies_needed"} for r in results)


# -- llama-cpp-python's own server, serving the embedded model ----------------------------------


@pytest.fixture(scope="session")
def llama_cpp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` with SmolLM2-135M on 127.0.0.1; its base URL."""
    folder = tmp_path_factory.mktemp("llama_cpp_server")
    with llama_cpp_python_server(folder, n_ctx=1024) as base_url:
        yield base_url


async def test_json_rows_succeed_on_llama_cpp_python_server(
    llama_cpp_server: str, info_log: pytest.LogCaptureFixture
) -> None:
    # Before structured_output, every row failed: HTTP 500 on json_schema, retried for ~40 s.
    texts = ["The app crashes on start", "How do I export?", "Love it!"]
    results = await process(llama_cpp_server, texts)
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(isinstance(r.value["urgent"], bool) for r in results)
    assert all(isinstance(r.value["replies_needed"], int) for r in results)
    assert in_use(info_log) == [f"structured output for smollm2 at {llama_cpp_server}: json_object"]
