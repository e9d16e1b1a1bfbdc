"""Structured output as real servers behave (issue 26, items 1 and 2): the dialect is learned
per (base URL, model), as behind a gateway that routes each model to its own server; a form
a server ignores with HTTP 200 is noticed from the first answers (``auto`` moves on, a named
one stops every row with one sentence); vLLM's ``structured_outputs``; and the emulator's
``--dialect``s answer each form as the real server was measured to (docs/providers.md),
checked against llama-cpp-python's own server where it runs."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from pydantic import BaseModel

from conftest import TEST_KEY
from llama_cpp_server_support import llama_cpp_python_server
from llm_kit import LLM, BatchConfig, BatchItem, BatchResult, Message
from llm_kit.dialect_choice import PROBATION
from llm_kit.dialects import DIALECTS
from llm_kit.providers.openai import OpenAICodec
from llm_kit.schema import schema_from_dict
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.__main__ import _parser
from provider_emulator.config import DIALECTS as SERVER_NAMES

CONCURRENCY = 4


class Ticket(BaseModel):
    label: Literal["bug", "question", "praise"]
    urgent: bool


def fresh(name: str) -> str:
    """A model name no other test used: the learned dialect lives as long as the process,
    and a later emulator may get an earlier one's port."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def tickets(n: int) -> list[BatchItem]:
    return [
        BatchItem(
            id=f"t{i}",
            messages=[Message.user(f"Classify this ticket: the app crashed {i} times")],
            response_model=Ticket,
        )
        for i in range(n)
    ]


def client(base_url: str, model: str, structured_output: str = "auto", **config: Any) -> LLM:
    settings = {"worker_concurrency": CONCURRENCY, "retry_base_delay": 0.01, **config}
    return LLM(
        model,
        base_url=base_url,
        api_key=TEST_KEY,
        max_tokens=48,
        structured_output=structured_output,
        config=BatchConfig(**settings),
    )


async def run_all(llm: LLM, items: list[BatchItem]) -> list[BatchResult]:
    return [result async for result in llm.batch_stream(items)]


@pytest.fixture
def info_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="llm_kit")
    return caplog


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "llm_kit.dialect_choice"]


# -- item 1: per (base URL, model) ---------------------------------------------------------------


async def test_a_model_that_refuses_json_schema_leaves_the_other_models_of_its_url_alone(
    info_log: pytest.LogCaptureFixture,
) -> None:
    # One URL, two backends, as behind LiteLLM: one model on llama-cpp-python, one on OpenAI.
    # Before: the first model's refusal moved the URL to json_object, and every row of the
    # OpenAI model then failed validation (its json_object is JSON mode, not the schema).
    llama, gpt = fresh("llama"), fresh("gpt")
    config = EmulatorConfig(model_dialects=((llama, "llama_cpp_python"),), record_requests=True)
    with running_emulator(config) as emu:
        url = emu.openai_base_url
        first = await run_all(client(url, llama, validation_retries=0), tickets(6))
        second = await run_all(client(url, gpt, validation_retries=0), tickets(6))
        sent = [r["body"] for r in emu.requests() if r["body"]["model"] == gpt]
    assert [r.ok for r in first + second] == [True] * 12, [r.error for r in first + second]
    # The OpenAI model keeps OpenAI's strict json_schema, not its neighbour's json_object.
    assert {b["response_format"]["type"] for b in sent} == {"json_schema"}
    assert all(b["response_format"]["json_schema"]["strict"] for b in sent)
    assert said(info_log) == [
        f"{llama} at {url} refused structured output as json_schema (HTTP 500); trying json_object",
        f"structured output for {llama} at {url}: json_object",
        f"structured output for {gpt} at {url}: json_schema",
    ]


# -- item 1: a form ignored with HTTP 200 --------------------------------------------------------


async def test_auto_moves_on_from_forms_a_server_ignores_without_spending_validation_retries(
    info_log: pytest.LogCaptureFixture,
) -> None:
    # `plain` knows no form and ignores each with a 200, as real servers ignore a field they do
    # not know: its answers are plain text until the schema is stated in the prompt. Before:
    # auto stayed on json_schema and every row failed validation, re-asks paid.
    model = fresh("plain")
    with running_emulator(EmulatorConfig(dialect="plain")) as emu:
        url = emu.openai_base_url
        results = await run_all(client(url, model, validation_retries=0), tickets(20))
        status = emu.stats()["status"]
    assert all(r.ok and isinstance(r.response, Ticket) for r in results), [
        r.error for r in results if not r.ok
    ][:3]
    # The re-sends happen below the item: no retry, no validation retry is spent on them.
    assert {r.attempts for r in results} == {1}
    lines = said(info_log)
    assert lines[-1] == f"structured output for {model} at {url}: prompt"
    given_up = [name for name in DIALECTS if name != "prompt"]
    assert lines[:-1] == [
        f"{model} at {url} ignored structured output as {name} (HTTP 200, but its first "
        f"{PROBATION} answers did not fit the schema); trying {after}"
        for name, after in zip(given_up, list(DIALECTS)[1:], strict=True)
    ]
    # What the probing cost: per form given up, those in flight and the probation's re-sends.
    assert set(status) == {"200"}
    assert 20 < status["200"] <= 20 + len(given_up) * (CONCURRENCY + PROBATION)


@pytest.mark.parametrize(
    ("dialect", "server"),
    [
        ("guided_json", "vllm"),  # vLLM 0.32: "output will NOT be constrained"
        ("structured_outputs", "vllm_legacy"),
        ("guided_json", "llama_server"),
        ("ollama_format", "llama_server"),
        ("structured_outputs", "llama_cpp_python"),
        ("json_schema", "plain"),
    ],
)
async def test_a_named_form_the_server_ignores_stops_every_row_with_one_sentence(
    dialect: str, server: str
) -> None:
    # Before: each row was asked, then re-asked validation_retries times, and failed for good
    # (here 3 paid requests a row: 60 for 20 rows).
    model = fresh("m")
    with running_emulator(EmulatorConfig(dialect=server)) as emu:  # type: ignore[arg-type]
        url = emu.openai_base_url
        results = await run_all(client(url, model, dialect, validation_retries=2), tickets(20))
        paid = emu.stats()["requests"]
    sentence = (
        f"the server ignores structured_output {dialect!r} for {model} at {url}: it answered "
        f"HTTP 200, but its first {PROBATION} answers did not fit the schema; set "
        "structured_output to auto, or to a form this server takes"
    )
    assert {r.error for r in results} == {sentence}
    # Recorded as each row's own error, and retryable: the rows are fine, the form is not.
    assert all(not r.ok and r.retryable for r in results)
    assert {r.error_kind for r in results} == {"structured_output_ignored"}
    # Those in flight and the probation's re-sends: not every row's validation retries.
    assert PROBATION <= paid <= CONCURRENCY + PROBATION
    # What was paid is on the rows that paid it; the rows never sent carry none.
    assert any(r.usage and r.usage.output_tokens for r in results)
    assert sum(1 for r in results if r.usage) <= CONCURRENCY


async def test_json_mode_that_ignores_the_schema_is_a_form_ignored_not_the_models_miss() -> None:
    # OpenAI's json_object is JSON mode: the schema beside it is ignored and the answers are
    # JSON that is no Ticket. Before: the form was trusted at the first JSON answer and every
    # row paid its validation retries (3 requests a row: 60), then failed for good.
    model = fresh("gpt")
    with running_emulator(EmulatorConfig()) as emu:
        llm = client(emu.openai_base_url, model, "json_object", validation_retries=2)
        items = tickets(20)
        for item in items:
            item.sampling = {"max_tokens": 256}  # room for the echo of a re-ask
        results = await run_all(llm, items)
        paid = emu.stats()["requests"]
    assert {r.error_kind for r in results} == {"structured_output_ignored"}
    assert all(not r.ok and r.retryable for r in results)
    assert "answers did not fit the schema" in (results[0].error or "")
    assert PROBATION <= paid <= CONCURRENCY + PROBATION  # in flight, and the re-sends


async def test_a_json_answer_that_misses_the_schema_in_the_prompt_form_is_the_models_miss() -> None:
    # Only the prompt form leaves the schema to the model: its misses are re-asked, then
    # recorded as validation failures, as before.
    model = fresh("gpt")
    with running_emulator(EmulatorConfig(invalid_json="always")) as emu:
        llm = client(emu.openai_base_url, model, "prompt", validation_retries=1)
        items = tickets(3)
        for item in items:
            item.sampling = {"max_tokens": 256}  # room for the echo of the re-ask
        results = await run_all(llm, items)
        assert emu.stats()["requests"] == 6
    assert {(r.ok, r.error_kind, r.attempts) for r in results} == {(False, "validation", 2)}


async def test_a_form_that_worked_once_is_not_judged_again(
    info_log: pytest.LogCaptureFixture,
) -> None:
    # After the first JSON answer, answers are no longer parsed twice; a later miss is the
    # model's and goes to validation retries.
    model = fresh("vllm")
    with running_emulator(EmulatorConfig(dialect="vllm")) as emu:
        url = emu.openai_base_url
        await run_all(client(url, model, "structured_outputs"), tickets(2))
        results = await run_all(client(url, model, "structured_outputs"), tickets(8))
        assert emu.stats()["status"] == {"200": 10}
    assert all(r.ok and r.attempts == 1 for r in results)
    assert said(info_log) == [f"structured output for {model} at {url}: structured_outputs"]


# -- item 2: what each form looks like on the wire, and each emulated server -------------------


# How each real server answers each form (docs/providers.md, measured December 2026; the
# Ollama row is not measured: a strict server that refuses all but its own form).
FOLLOWS, IGNORED = "follows", "ignored with 200"
REAL_SERVERS: dict[str, dict[str, str]] = {
    "openai": {
        "json_schema": FOLLOWS,
        "json_object": FOLLOWS,
        "structured_outputs": "refused 400",
        "guided_json": "refused 400",
        "ollama_format": "refused 400",
    },
    "vllm": {
        "json_schema": FOLLOWS,
        "json_object": FOLLOWS,
        "structured_outputs": FOLLOWS,
        "guided_json": IGNORED,
        "ollama_format": IGNORED,
    },
    "vllm_legacy": {
        "json_schema": FOLLOWS,
        "json_object": FOLLOWS,
        "structured_outputs": IGNORED,
        "guided_json": FOLLOWS,
        "ollama_format": IGNORED,
    },
    "llama_server": {
        "json_schema": FOLLOWS,
        "json_object": FOLLOWS,
        "structured_outputs": IGNORED,
        "guided_json": IGNORED,
        "ollama_format": IGNORED,
    },
    "llama_cpp_python": {
        "json_schema": "refused 500",
        "json_object": FOLLOWS,
        "structured_outputs": IGNORED,
        "guided_json": IGNORED,
        "ollama_format": IGNORED,
    },
    "ollama": {
        "json_schema": "refused 400",
        "json_object": "refused 400",
        "structured_outputs": "refused 400",
        "guided_json": "refused 400",
        "ollama_format": FOLLOWS,
    },
    "plain": dict.fromkeys(
        ("json_schema", "json_object", "structured_outputs", "guided_json", "ollama_format"),
        IGNORED,
    ),
}
SMALL_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def outcome(base_url: str, model: str, form: str) -> str:
    """One request in ``form`` (llm_kit's own encoding of it), classified as the table says."""
    messages = [Message.user("Say hello to Ada in one short sentence.")]
    body = OpenAICodec().encode(model, messages, {"max_tokens": 32, "temperature": 0}, None)
    DIALECTS[form].apply(body, schema_from_dict("Answer", SMALL_SCHEMA))
    request = urllib.request.Request(
        base_url + "/chat/completions",
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TEST_KEY}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            text = orjson.loads(reply.read())["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as exc:
        return f"refused {exc.code}"
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return IGNORED
    return FOLLOWS


def test_every_emulated_server_is_in_the_table() -> None:
    assert set(REAL_SERVERS) == set(SERVER_NAMES)
    assert all(set(row) == set(DIALECTS) - {"prompt"} for row in REAL_SERVERS.values())


def test_each_emulated_server_answers_each_form_as_the_real_one() -> None:
    # One emulator, each server behind a model of its own name (a gateway's routing).
    config = EmulatorConfig(model_dialects=tuple((name, name) for name in SERVER_NAMES))
    with running_emulator(config) as emu:
        seen = {
            server: {form: outcome(emu.openai_base_url, server, form) for form in row}
            for server, row in REAL_SERVERS.items()
        }
    assert seen == REAL_SERVERS


def test_vllms_current_form_carries_the_schema_under_json() -> None:
    body = OpenAICodec().encode("m", [Message.user("hi")], {}, None)
    DIALECTS["structured_outputs"].apply(body, schema_from_dict("Answer", SMALL_SCHEMA))
    assert body["structured_outputs"] == {"json": SMALL_SCHEMA}
    assert "guided_json" not in body and "response_format" not in body


def test_the_emulator_command_lines_take_a_model_dialect() -> None:
    args = vars(_parser().parse_args(["--model-dialect", "smollm2=llama_cpp_python"]))
    assert args["model_dialect"] == ["smollm2=llama_cpp_python"]
    config = EmulatorConfig(model_dialects=(("a/b=c", "vllm"),))
    assert "--model-dialect=a/b=c=vllm" in config.to_argv()
    assert EmulatorConfig.from_options(model_dialect=["a/b=c=vllm"]).model_dialects == (
        ("a/b=c", "vllm"),
    )
    with pytest.raises(ValueError, match="dialect must be one of"):
        EmulatorConfig(model_dialects=(("m", "tgi"),))  # type: ignore[arg-type]
    help_text = subprocess.run(
        [sys.executable, "-m", "mmirage", "emulate", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--model-dialect" in help_text and "vllm_legacy" in help_text


# -- against llama-cpp-python's own server ------------------------------------------------------


@pytest.fixture(scope="module")
def real_llama_cpp_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` with SmolLM2-135M on 127.0.0.1; its base URL."""
    folder = tmp_path_factory.mktemp("llama_cpp_python")
    with llama_cpp_python_server(folder, n_ctx=1024, alias="smollm2") as base_url:
        yield base_url


def test_the_real_llama_cpp_python_server_answers_each_form_as_the_table_says(
    real_llama_cpp_python: str,
) -> None:
    row = REAL_SERVERS["llama_cpp_python"]
    seen = {form: outcome(real_llama_cpp_python, "smollm2", form) for form in row}
    assert seen == row


async def test_a_named_form_llama_cpp_python_ignores_stops_early_there_too(
    real_llama_cpp_python: str,
) -> None:
    model = "smollm2"
    with_guided = client(real_llama_cpp_python, model, "guided_json", worker_concurrency=1)
    results = await run_all(with_guided, tickets(5))
    assert all(not r.ok and r.retryable for r in results), [r.error for r in results]
    assert {r.error_kind for r in results} == {"structured_output_ignored"}
    error = results[0].error or ""
    assert error.startswith("the server ignores structured_output 'guided_json' for smollm2 at ")
    # The probation's re-sends go below the item: no row spent a retry on them.
    assert {r.attempts for r in results} == {1}


# -- the mmirage CLI: a named form the server ignores, then `mmirage retry` with auto ----------


def cli_config(tmp_path: Path, base_url: str, model: str, structured_output: str) -> Path:
    data = tmp_path / "tickets.jsonl"
    rows = (orjson.dumps({"text": f"the app crashed {i} times"}) + b"\n" for i in range(8))
    data.write_bytes(b"".join(rows))
    config = tmp_path / "config.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            processors:
              - type: llm
                base_url: {base_url}
                model: {model}
                structured_output: {structured_output}
                worker_concurrency: {CONCURRENCY}
                validation_retries: 2
                default_sampling_params:
                  max_new_tokens: 64
            loading_params:
              state_dir: {tmp_path}/state
              datasets:
                - path: {data}
                  type: JSONL
                  output_dir: {tmp_path}/data
              output_format: jsonl
            processing_params:
              inputs:
                - name: text
                  key: text
              outputs:
                - name: ticket
                  type: llm
                  output_type: JSON
                  output_schema:
                    urgent: bool
                    replies_needed: int
                  prompt: "Triage this ticket: {{{{ text }}}}"
              output_schema:
                urgent: "{{{{ ticket.urgent }}}}"
            """
        )
    )
    return config


def mmirage(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": TEST_KEY}
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a bound on a hang, not a timing check
    )


def test_the_cli_stops_a_named_ignored_form_with_one_sentence_and_retry_fixes_it(
    tmp_path: Path,
) -> None:
    model = fresh("vllm")
    with running_emulator(EmulatorConfig(dialect="vllm")) as emu:
        url = emu.openai_base_url
        config = cli_config(tmp_path, url, model, "guided_json")
        first = mmirage("run", "--config", str(config))
        paid = emu.stats()["requests"]
        cli_config(tmp_path, url, model, "auto")
        second = mmirage("retry", "--config", str(config))
    assert first.returncode == 1, first.stderr
    sentence = f"the server ignores structured_output 'guided_json' for {model} at {url}"
    assert sentence in first.stderr and "'mmirage retry CONFIG'" in first.stderr, first.stderr
    assert paid <= CONCURRENCY + PROBATION  # before: 8 rows x 3 paid attempts
    assert second.returncode == 0, second.stderr
    rows = [orjson.loads(line) for path in (tmp_path / "data").rglob("*.jsonl")
            for line in path.read_bytes().splitlines()]  # fmt: skip
    assert len(rows) == 8 and all(isinstance(row["urgent"], bool) for row in rows), rows
