"""The emulator speaks the providers' live wire formats: the official SDKs work against it.

Faults, budgets and validation errors are checked with raw aiohttp, where status codes and
headers are visible as they are sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar, Literal

import aiohttp
import anthropic
import click
import openai
import orjson
import pytest
from click.testing import CliRunner
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types
from pydantic import BaseModel, Field

from llm_kit.providers.base import Completion
from llm_kit.types import Usage
from mmirage.cli import main as mmirage_main
from provider_emulator import EmulatorConfig, Faults, emulator_in_loop, running_emulator
from provider_emulator.limits import go_duration
from provider_emulator.runner import EmulatorHandle
from provider_emulator.schema_value import to_json_schema, value_for_schema

KEY = "test-key"
PNG_1X1 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5"
    "ErkJggg=="
)
ANTHROPIC_HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
OPENAI_HEADERS = {"Authorization": f"Bearer {KEY}"}


class Tag(BaseModel):
    name: str = Field(min_length=3, max_length=12)
    weight: float = Field(ge=0.5, lt=0.75)


class Label(BaseModel):
    label: Literal["cat", "dog"]
    confidence: int = Field(ge=5, le=9)
    tags: list[Tag] = Field(min_length=2, max_length=3)
    note: str | None
    when: dt.date


class Verdict(BaseModel):
    """Within what Gemini's response_schema accepts (no exclusive bounds)."""

    label: Literal["cat", "dog"]
    confidence: int = Field(ge=5, le=9)
    reasons: list[str] = Field(min_length=2)
    note: str | None


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorHandle]:
    with running_emulator() as handle:
        yield handle


def chat_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], **extra}


def anthropic_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude-haiku-4-5",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}


@contextlib.asynccontextmanager
async def served(
    config: EmulatorConfig, headers: dict[str, str] | None = None
) -> AsyncIterator[tuple[EmulatorHandle, aiohttp.ClientSession]]:
    """An emulator on the test's loop and a raw aiohttp session (status and headers as sent)."""
    async with emulator_in_loop(config) as emu, aiohttp.ClientSession(headers=headers) as http:
        yield emu, http


def gemini_url(emu: EmulatorHandle, model: str = "gemini-2.5-flash") -> str:
    return f"{emu.gemini_base_url}/v1beta/models/{model}:generateContent"


# -- OpenAI SDK ------------------------------------------------------------------------------


def test_openai_chat_completion(emu: EmulatorHandle) -> None:
    client = openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)
    completion = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "What is 2+2?"},
        ],
    )
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-4o-mini"
    assert completion.choices[0].message.content == "echo: What is 2+2?"
    assert completion.choices[0].finish_reason == "stop"
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_openai_json_schema_answer_validates(emu: EmulatorHandle) -> None:
    client = openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)
    completion = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "label this"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "label", "schema": Label.model_json_schema()},
        },
    )
    content = completion.choices[0].message.content
    assert content is not None
    label = Label.model_validate_json(content)
    assert 2 <= len(label.tags) <= 3
    # The SDK's own structured-output helper parses it too.
    parsed = client.chat.completions.parse(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "label this"}],
        response_format=Label,
    )
    assert isinstance(parsed.choices[0].message.parsed, Label)


def test_openai_length_finish_reason(emu: EmulatorHandle) -> None:
    client = openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)
    completion = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x" * 100}], max_tokens=2
    )
    assert completion.choices[0].finish_reason == "length"
    assert len(completion.choices[0].message.content or "") == 8


async def test_openai_async_models_list(emu: EmulatorHandle) -> None:
    client = openai.AsyncOpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)
    ids = [model.id async for model in client.models.list()]
    assert "gpt-4o-mini" in ids
    model = await client.models.retrieve("my-fine-tune")
    assert model.id == "my-fine-tune" and model.object == "model"
    await client.close()


def test_openai_missing_key_is_401(emu: EmulatorHandle) -> None:
    client = openai.OpenAI(
        base_url=emu.openai_base_url,
        api_key=KEY,
        max_retries=0,
        default_headers={"Authorization": ""},
    )
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
    assert info.value.status_code == 401
    assert info.value.body["type"] == "invalid_request_error"  # type: ignore[index]


# -- Anthropic SDK ---------------------------------------------------------------------------


def test_anthropic_message_with_system_and_image(emu: EmulatorHandle) -> None:
    client = anthropic.Anthropic(base_url=emu.anthropic_base_url, api_key=KEY, max_retries=0)
    message = client.messages.create(
        model="claude-haiku-4-5",
        max_tokens=100,
        system="You are terse.",
        messages=[
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": PNG_1X1},
                    },
                    {"type": "text", "text": "Describe it."},
                ],
            }
        ],
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "end_turn"
    block = message.content[0]
    assert block.type == "text" and block.text == "echo: Describe it."
    assert message.usage.input_tokens > 85  # the image is counted


def test_anthropic_forced_tool_use_matches_input_schema(emu: EmulatorHandle) -> None:
    client = anthropic.Anthropic(base_url=emu.anthropic_base_url, api_key=KEY, max_retries=0)
    message = client.messages.create(
        model="claude-haiku-4-5",
        max_tokens=200,
        messages=[{"role": "user", "content": "label the picture"}],
        tools=[
            {"name": "record", "description": "Save it.", "input_schema": Label.model_json_schema()}
        ],
        tool_choice={"type": "tool", "name": "record"},
    )
    assert message.stop_reason == "tool_use"
    block = message.content[0]
    assert block.type == "tool_use" and block.name == "record"
    assert block.id.startswith("toolu_")
    Label.model_validate(block.input)


def test_anthropic_output_config_json_schema(emu: EmulatorHandle) -> None:
    client = anthropic.Anthropic(base_url=emu.anthropic_base_url, api_key=KEY, max_retries=0)
    message = client.messages.create(
        model="claude-haiku-4-5",
        max_tokens=200,
        messages=[{"role": "user", "content": "label"}],
        output_config={"format": {"type": "json_schema", "schema": Label.model_json_schema()}},
    )
    block = message.content[0]
    assert block.type == "text"
    Label.model_validate_json(block.text)


def test_anthropic_rejects_bad_image_type_and_missing_key(emu: EmulatorHandle) -> None:
    client = anthropic.Anthropic(base_url=emu.anthropic_base_url, api_key=KEY, max_retries=0)
    image = {"type": "base64", "media_type": "image/bmp", "data": PNG_1X1}
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model="claude-haiku-4-5",
            max_tokens=10,
            messages=[{"role": "user", "content": [{"type": "image", "source": image}]}],  # type: ignore[list-item,typeddict-item]
        )
    assert "media_type" in str(bad.value)
    keyless = anthropic.Anthropic(
        base_url=emu.anthropic_base_url,
        api_key=KEY,
        max_retries=0,
        default_headers={"Authorization": anthropic.omit, "x-api-key": ""},
    )
    with pytest.raises(anthropic.AuthenticationError):
        keyless.messages.create(
            model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )


# -- Google GenAI SDK ------------------------------------------------------------------------


def gemini_client(emu: EmulatorHandle, **headers: str) -> genai.Client:
    options = genai_types.HttpOptions(base_url=emu.gemini_base_url, headers=headers or None)
    return genai.Client(api_key=KEY, http_options=options)


def test_gemini_generate_content(emu: EmulatorHandle) -> None:
    client = gemini_client(emu)  # the SDK closes its HTTP client when this is collected
    response = client.models.generate_content(
        model="gemini-2.5-flash",
        contents="Tell me a joke.",
        config=genai_types.GenerateContentConfig(system_instruction="Be funny."),
    )
    assert response.text == "echo: Tell me a joke."
    assert response.candidates and response.candidates[0].finish_reason == "STOP"
    usage = response.usage_metadata
    assert usage is not None and usage.total_token_count == (
        (usage.prompt_token_count or 0) + (usage.candidates_token_count or 0)
    )
    assert response.model_version == "gemini-2.5-flash"


def test_gemini_response_schema_from_pydantic(emu: EmulatorHandle) -> None:
    client = gemini_client(emu)
    response = client.models.generate_content(
        model="gemini-2.5-flash",
        contents="label this",
        config=genai_types.GenerateContentConfig(
            response_mime_type="application/json", response_schema=Verdict
        ),
    )
    assert isinstance(response.parsed, Verdict)
    assert Verdict.model_validate_json(response.text or "").confidence == 5


def test_gemini_missing_key_is_403(emu: EmulatorHandle) -> None:
    client = gemini_client(emu, **{"x-goog-api-key": ""})
    with pytest.raises(genai_errors.ClientError) as info:
        client.models.generate_content(model="gemini-2.5-flash", contents="hi")
    assert info.value.code == 403 and info.value.status == "PERMISSION_DENIED"


# -- validation errors, in each provider's shape -------------------------------------------


async def test_validation_errors_use_each_providers_shape(emu: EmulatorHandle) -> None:
    async with aiohttp.ClientSession() as http:
        no_messages = {"model": "gpt-4o-mini"}
        async with http.post(
            f"{emu.openai_base_url}/chat/completions", json=no_messages, headers=OPENAI_HEADERS
        ) as r:
            body = await r.json()
            assert r.status == 400
            assert body["error"]["param"] == "messages"
            assert body["error"]["type"] == "invalid_request_error"
        no_max_tokens = anthropic_body()
        del no_max_tokens["max_tokens"]
        async with http.post(
            f"{emu.anthropic_base_url}/v1/messages", json=no_max_tokens, headers=ANTHROPIC_HEADERS
        ) as r:
            body = await r.json()
            assert r.status == 400 and body["type"] == "error"
            assert body["error"]["type"] == "invalid_request_error"
            assert "max_tokens" in body["error"]["message"]
            assert r.headers["request-id"] == body["request_id"]
        async with http.post(gemini_url(emu), json={}, params={"key": KEY}) as r:
            body = await r.json()
            assert r.status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
        async with http.post(gemini_url(emu), json=GEMINI_BODY) as r:  # no key at all
            body = await r.json()
            assert r.status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
        async with http.post(
            f"{emu.openai_base_url}/chat/completions", data=b"{not json", headers=OPENAI_HEADERS
        ) as r:
            assert r.status == 400
        async with http.post(
            f"{emu.openai_base_url}/chat/completions",
            json=chat_body(stream=True),
            headers=OPENAI_HEADERS,
        ) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "stream"


# -- rate limits ------------------------------------------------------------------------------


async def test_openai_rpm_budget_answers_429_with_headers() -> None:
    async with emulator_in_loop(EmulatorConfig(rpm=2, tpm=100_000)) as emu:
        url = f"{emu.openai_base_url}/chat/completions"
        async with aiohttp.ClientSession(headers=OPENAI_HEADERS) as http:
            remaining = []
            for _ in range(2):
                async with http.post(url, json=chat_body()) as r:
                    assert r.status == 200
                    assert r.headers["x-ratelimit-limit-requests"] == "2"
                    assert r.headers["x-ratelimit-limit-tokens"] == "100000"
                    remaining.append(int(r.headers["x-ratelimit-remaining-requests"]))
            assert remaining == [1, 0]
            async with http.post(url, json=chat_body()) as r:
                body = await r.json()
                assert r.status == 429
                assert body["error"]["code"] == "rate_limit_exceeded"
                # One request refills in 30 s at 2 RPM.
                assert 25_000 <= int(r.headers["retry-after-ms"]) <= 30_000
                assert int(r.headers["retry-after"]) in range(25, 31)
                assert re.fullmatch(r"\d+(\.\d+)?s", r.headers["x-ratelimit-reset-requests"])
                assert r.headers["x-should-retry"] == "true"
        assert emu.stats()["status"] == {"200": 2, "429": 1}


async def test_tpm_budget_charges_input_plus_max_tokens() -> None:
    async with emulator_in_loop(EmulatorConfig(tpm=1000)) as emu:
        url = f"{emu.openai_base_url}/chat/completions"
        async with aiohttp.ClientSession(headers=OPENAI_HEADERS) as http:
            async with http.post(url, json=chat_body(max_tokens=700)) as r:
                assert r.status == 200
                assert 290 <= int(r.headers["x-ratelimit-remaining-tokens"]) < 300
            async with http.post(url, json=chat_body(max_tokens=700)) as r:
                assert r.status == 429
                assert (await r.json())["error"]["type"] == "tokens"


async def test_anthropic_and_gemini_budgets() -> None:
    async with emulator_in_loop(EmulatorConfig(rpm=1)) as emu, aiohttp.ClientSession() as http:
        url = f"{emu.anthropic_base_url}/v1/messages"
        async with http.post(url, json=anthropic_body(), headers=ANTHROPIC_HEADERS) as r:
            assert r.status == 200
            assert r.headers["anthropic-ratelimit-requests-limit"] == "1"
            assert r.headers["anthropic-ratelimit-requests-remaining"] == "0"
            reset = dt.datetime.fromisoformat(r.headers["anthropic-ratelimit-requests-reset"])
            assert reset > dt.datetime.now(dt.UTC)
        async with http.post(url, json=anthropic_body(), headers=ANTHROPIC_HEADERS) as r:
            body = await r.json()
            assert r.status == 429 and body["error"]["type"] == "rate_limit_error"
            assert r.headers["retry-after"].isdigit()
        # Each provider family has its own bucket: Gemini's is still full.
        async with http.post(gemini_url(emu), json=GEMINI_BODY, params={"key": KEY}) as r:
            assert r.status == 200
        async with http.post(gemini_url(emu), json=GEMINI_BODY, params={"key": KEY}) as r:
            error = (await r.json())["error"]
            assert r.status == 429 and error["status"] == "RESOURCE_EXHAUSTED"
            retry = [d for d in error["details"] if d["@type"].endswith("RetryInfo")]
            assert re.fullmatch(r"\d+(\.\d+)?s", retry[0]["retryDelay"])


def test_go_durations() -> None:
    assert go_duration(0.012) == "12ms"
    assert go_duration(1) == "1s"
    assert go_duration(360) == "6m0s"
    assert go_duration(179.56) == "2m59.56s"
    assert go_duration(3723) == "1h2m3s"


# -- injected faults -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "status", "error_code", "should_retry"),
    [
        (Faults(rate_500=1), 500, None, "true"),
        (Faults(rate_503=1), 503, None, "true"),
        (Faults(rate_529=1), 529, None, "true"),
        (Faults(rate_429=1, retry_after_s=0.25), 429, "rate_limit_exceeded", "true"),
        (Faults(rate_insufficient_quota=1), 429, "insufficient_quota", "false"),
    ],
)
async def test_openai_injected_faults(
    faults: Faults, status: int, error_code: str | None, should_retry: str
) -> None:
    async with (
        served(EmulatorConfig(faults=faults), OPENAI_HEADERS) as (emu, http),
        http.post(f"{emu.openai_base_url}/chat/completions", json=chat_body()) as r,
    ):
        body = await r.json()
    assert r.status == status
    assert body["error"]["code"] == error_code
    assert r.headers["x-should-retry"] == should_retry
    if error_code == "rate_limit_exceeded":
        assert r.headers["retry-after-ms"] == "250" and r.headers["retry-after"] == "1"
    else:
        assert "retry-after" not in r.headers


async def test_anthropic_and_gemini_injected_faults() -> None:
    faults = Faults(rate_529=0.5, rate_500=0.5)
    async with served(EmulatorConfig(faults=faults, seed=1)) as (emu, http):
        url = f"{emu.anthropic_base_url}/v1/messages"
        types = set()
        for _ in range(20):
            async with http.post(url, json=anthropic_body(), headers=ANTHROPIC_HEADERS) as r:
                types.add((r.status, (await r.json())["error"]["type"]))
        assert types == {(529, "overloaded_error"), (500, "api_error")}
        statuses = set()
        for _ in range(20):
            async with http.post(gemini_url(emu), json=GEMINI_BODY, params={"key": KEY}) as r:
                statuses.add((r.status, (await r.json())["error"]["status"]))
        assert statuses == {(529, "UNAVAILABLE"), (500, "INTERNAL")}
    async with (
        served(EmulatorConfig(faults=Faults(rate_429=1, retry_after_s=2))) as (emu, http),
        http.post(gemini_url(emu), json=GEMINI_BODY, params={"key": KEY}) as r,
    ):
        details = (await r.json())["error"]["details"]
        assert r.status == 429
        retry_info = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2s"}
        assert retry_info in details


async def test_reset_closes_the_connection_without_answer() -> None:
    async with emulator_in_loop(EmulatorConfig(faults=Faults(rate_reset=1))) as emu:
        async with aiohttp.ClientSession(headers=OPENAI_HEADERS) as http:
            with pytest.raises(aiohttp.ClientConnectionError):
                async with http.post(
                    f"{emu.openai_base_url}/chat/completions", json=chat_body()
                ) as r:
                    await r.read()
        assert emu.stats()["status"] == {"reset": 1}


async def test_hang_outlasts_the_client_timeout_and_ends_at_shutdown() -> None:
    faults = Faults(rate_hang=1, hang_s=300)
    started = time.monotonic()
    async with emulator_in_loop(EmulatorConfig(faults=faults)) as emu:
        timeout = aiohttp.ClientTimeout(total=0.3)
        async with aiohttp.ClientSession(headers=OPENAI_HEADERS, timeout=timeout) as http:
            with pytest.raises(asyncio.TimeoutError):
                async with http.post(
                    f"{emu.openai_base_url}/chat/completions", json=chat_body()
                ) as r:
                    await r.read()
    assert time.monotonic() - started < 10  # shutdown did not wait out the 300 s hang


async def test_short_hang_then_answers() -> None:
    config = EmulatorConfig(faults=Faults(rate_hang=1, hang_s=0.2))
    async with served(config, OPENAI_HEADERS) as (emu, http):
        started = time.monotonic()
        async with http.post(f"{emu.openai_base_url}/chat/completions", json=chat_body()) as r:
            assert r.status == 200
        assert time.monotonic() - started >= 0.2


async def test_seeded_faults_repeat_exactly() -> None:
    async def statuses() -> list[int]:
        config = EmulatorConfig(faults=Faults(rate_500=0.3, rate_503=0.3), seed=42)
        async with served(config, OPENAI_HEADERS) as (emu, http):
            out = []
            for _ in range(30):
                url = f"{emu.openai_base_url}/chat/completions"
                async with http.post(url, json=chat_body()) as r:
                    out.append(r.status)
            return out

    first = await statuses()
    assert first == await statuses()
    assert {200, 500, 503} == set(first)


def test_fault_rates_are_validated() -> None:
    with pytest.raises(ValueError):
        Faults(rate_500=0.7, rate_429=0.5)
    with pytest.raises(ValueError):
        Faults(rate_reset=1.5)


# -- stats, latency, processes ---------------------------------------------------------------


async def test_stats_latency_and_reset() -> None:
    config = EmulatorConfig(latency_s=0.5, record_times=True)
    async with emulator_in_loop(config) as emu:
        async with aiohttp.ClientSession(headers=OPENAI_HEADERS) as http:
            url = f"{emu.openai_base_url}/chat/completions"

            async def answered_at() -> float:
                async with http.post(url, json=chat_body()) as r:
                    await r.read()
                return time.time()

            started = time.monotonic()
            answers = await asyncio.gather(*(answered_at() for _ in range(5)))
            assert time.monotonic() - started >= 0.5
            async with http.get(f"{emu.url}/_emulator/stats") as r:
                stats = await r.json()
        # Concurrent, not serialised: all five were let in before the first answer came back
        # (an order of events, which a loaded machine cannot turn around; a duration it can).
        assert max(stats["times"]) < min(answers)
        assert stats["requests"] == 5 and stats["status"] == {"200": 5}
        assert stats["families"] == {"openai": 5} and len(stats["times"]) == 5
        emu.reset_stats()
        assert emu.stats()["requests"] == 0


async def test_a_request_counts_when_it_arrives_not_when_its_answer_is_ready() -> None:
    """A client that gives up on a slow answer (a stopped run) paid for the request then: a
    reset after it must not find it counted later, in the next run's stats."""
    async with emulator_in_loop(EmulatorConfig(latency_s=0.6)) as emu:
        async with aiohttp.ClientSession(headers=OPENAI_HEADERS) as http:
            url = f"{emu.openai_base_url}/chat/completions"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(http.post(url, json=chat_body()), 0.2)
        assert emu.stats()["requests"] == 1 and emu.stats()["status"] == {}
        emu.reset_stats()
        await asyncio.sleep(0.8)  # the abandoned request's answer is made meanwhile
        assert emu.stats()["requests"] == 0 and emu.stats()["status"] == {"200": 1}


def test_subprocess_with_two_workers_serves_and_stops() -> None:
    with running_emulator(EmulatorConfig(workers=2), subprocess=True) as emu:
        client = openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "two"}]
        )
        assert answer.choices[0].message.content == "echo: two"
        assert emu.stats()["pid"] != os.getpid()
        port = emu.port
    with pytest.raises(openai.APIConnectionError):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0)
        client.models.list()


def test_mmirage_emulate_serves_and_exits_cleanly_on_sigterm() -> None:
    script = Path(sys.executable).with_name("mmirage")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "mmirage.cli"]
    process = subprocess.Popen(
        [*command, "emulate", "--port", "0", "--seed", "1"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"OpenAI (http://127\.0\.0\.1:(\d+)/v1)", line)
        assert match, line
        client = openai.OpenAI(base_url=match.group(1), api_key=KEY, max_retries=0)
        answer = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "cli"}]
        )
        assert answer.choices[0].message.content == "echo: cli"
        assert f"Anthropic http://127.0.0.1:{match.group(2)}" in line
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()


def test_mmirage_emulate_usage_errors_exit_2() -> None:
    runner = CliRunner()
    assert runner.invoke(mmirage_main, ["emulate", "--fault-500", "2"]).exit_code == 2
    assert runner.invoke(mmirage_main, ["emulate", "--responder", "gpt"]).exit_code == 2
    result = runner.invoke(mmirage_main, ["emulate", "--fault-500", "0.6", "--fault-503", "0.6"])
    assert result.exit_code == 2 and "more than 1" in result.output


# -- schema-valid values ---------------------------------------------------------------------


class Node(BaseModel):
    name: str
    children: list[Node] = []
    parent: Node | None = None


class Odd(BaseModel):
    kind: Literal["x"]
    pair: tuple[int, str]
    multiple: int = Field(multiple_of=7, gt=10)
    ratio: float = Field(gt=0, lt=1)
    ident: str = Field(pattern=r"^.*$", min_length=40)
    stamp: dt.datetime
    blob: dict[str, int]
    maybe: int | None = None


@pytest.mark.parametrize("model", [Label, Node, Odd])
def test_values_validate_against_pydantic_schemas(model: type[BaseModel]) -> None:
    value = value_for_schema(model.model_json_schema(), "echo: hi")
    model.model_validate(value)


def test_gemini_openapi_schema_values() -> None:
    schema = {
        "type": "OBJECT",
        "properties": {
            "labels": {"type": "ARRAY", "items": {"type": "STRING"}, "minItems": "2"},
            "max_length": {"type": "ARRAY", "items": {"type": "BOOLEAN"}, "min_items": 3},
            "score": {"type": "NUMBER", "minimum": 3, "maximum": 4},
            "mood": {"type": "STRING", "format": "enum", "enum": ["sad", "happy"]},
            "maybe": {"type": "INTEGER", "nullable": True},
        },
        "required": ["labels", "score", "mood"],
    }
    value = value_for_schema(schema)
    assert len(value["labels"]) == 2 and 3 <= value["score"] <= 4
    assert len(value["max_length"]) == 3  # snake_case keyword, property names untouched
    assert value["mood"] == "sad" and isinstance(value["maybe"], int)
    plain = to_json_schema(schema)
    assert plain["type"] == "object" and plain["properties"]["maybe"]["type"] == ["integer", "null"]
    assert orjson.loads(orjson.dumps(value)) == value


# -- the local responder, through a stand-in engine ------------------------------------------


class FakeEngine:
    """Stands in for llm_kit.local.LocalEngine: records calls, answers instantly."""

    calls: ClassVar[list[dict[str, Any]]] = []

    @classmethod
    def shared(cls) -> FakeEngine:
        return cls()

    def load(self) -> None:
        pass

    async def complete(self, messages: list[dict[str, str]], **options: Any) -> Completion:
        FakeEngine.calls.append({"messages": messages, **options})
        text = '{"label": "cat"}' if options["json_schema"] else "local says hi"
        return Completion(text, Usage(7, 3), "stop")


def test_local_responder_uses_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llm_kit.local", SimpleNamespace(LocalEngine=FakeEngine))
    FakeEngine.calls.clear()
    with running_emulator(EmulatorConfig(responder="local")) as emu:
        client = openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)
        answer = client.chat.completions.create(
            model="m",
            messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
            max_tokens=9,
        )
        gemini = gemini_client(emu)
        schema = {"type": "OBJECT", "properties": {"label": {"type": "STRING"}}}
        reply = gemini.models.generate_content(
            model="gemini-2.5-flash",
            contents="label",
            config={"response_mime_type": "application/json", "response_schema": schema},
        )
    assert answer.choices[0].message.content == "local says hi"
    assert answer.usage is not None and answer.usage.prompt_tokens == 7
    first, second = FakeEngine.calls
    assert first["messages"] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "hi"},
    ]
    assert first["max_tokens"] == 9 and first["json_schema"] is None
    assert second["json_schema"]["properties"]["label"]["type"] == "string"
    assert reply.text == '{"label": "cat"}'


def test_local_responder_without_the_extra_fails_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "llm_kit.local", None)  # import raises ImportError
    with (
        pytest.raises(RuntimeError, match=r"pip install -e '\.\[local\]'"),
        running_emulator(EmulatorConfig(responder="local")),
    ):
        pass


def test_both_emulator_command_lines_take_the_same_flags() -> None:
    """`mmirage emulate` declares its flags itself (importing llm_kit would slow every command):
    it must still offer every flag of `python -m provider_emulator`, with the same choices."""
    from provider_emulator.__main__ import _parser

    parser = _parser()
    ours = {flag for option in parser._actions for flag in option.option_strings}
    command = mmirage_main.get_command(click.Context(mmirage_main), "emulate")
    assert command is not None
    theirs = {flag for param in command.params for flag in getattr(param, "opts", [])}
    assert ours - {"-h", "--help"} <= theirs
    choices = {a.option_strings[0]: list(a.choices) for a in parser._actions if a.choices}
    for param in command.params:
        if isinstance(param.type, click.Choice) and param.opts[0] in choices:
            assert list(param.type.choices) == choices[param.opts[0]], param.opts[0]
