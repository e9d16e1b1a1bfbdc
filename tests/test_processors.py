"""The llm and custom processors behind the runner's contract (OutputRequest → OutputResult)."""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path
from typing import Any

import pytest

from llm_kit import MissingAPIKeyError
from mmirage.config.errors import ConfigError
from mmirage.config.processing_params import CustomOutput, LLMOutput
from mmirage.config.processors import (
    CustomProcessorConfig,
    ImageGenProcessorConfig,
    LLMProcessorConfig,
)
from mmirage.config.validation import build
from mmirage.core.process.base import OutputRequest
from mmirage.core.process.custom_processor import CustomProcessor
from mmirage.core.process.factory import build_processor
from mmirage.core.process.llm_processor import LLMProcessor
from provider_emulator import EmulatorConfig, Faults, running_emulator

SOURCE = "test.yaml"


def llm_config(**raw: Any) -> LLMProcessorConfig:
    return build(LLMProcessorConfig, {"type": "llm", **raw}, ("processors", 0), SOURCE)


def custom_config(**raw: Any) -> CustomProcessorConfig:
    return build(CustomProcessorConfig, {"type": "custom", **raw}, ("processors", 0), SOURCE)


def requests(output: str, prompts: list[str]) -> list[OutputRequest]:
    return [
        OutputRequest(
            row_key=f"0::{i}",
            output_name=output,
            prompt=p,
            variables={"text": p, "i": i},
            row={"raw_text": p, "id": i},
        )
        for i, p in enumerate(prompts)
    ]


# -- llm ----------------------------------------------------------------------------------------


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The emulator wants a key (any string), as a real OpenAI-compatible server may."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")


async def test_plain_output_over_http(emulator: Any, key: None) -> None:
    processor = build_processor(llm_config(base_url=emulator.openai_base_url, model="m"))
    assert isinstance(processor, LLMProcessor)
    output = LLMOutput(name="caption", prompt="{{ text }}")
    try:
        results = await processor.process(output, requests("caption", ["hello", "world", "x"]))
    finally:
        await processor.aclose()
    assert [r.value for r in results] == ["echo: hello", "echo: world", "echo: x"]
    assert all(r.ok and r.input_tokens > 0 and r.output_tokens > 0 for r in results)


async def test_json_output_is_a_dict_keyed_by_the_schema(emulator: Any, key: None) -> None:
    config = llm_config(message_format="openai", base_url=emulator.openai_base_url, model="m")
    processor = LLMProcessor(config)
    output = LLMOutput(
        name="qa",
        prompt="{{ text }}",
        output_type="JSON",
        output_schema={"question": "str", "score": {"type": "int", "min": 0, "max": 5}},
    )
    try:
        results = await processor.process(output, requests("qa", ["a", "b"]))
        await processor.process(output, requests("qa", ["c"]))
    finally:
        await processor.aclose()
    assert len(processor._models) == 1  # one pydantic model per output, not per call
    for result in results:
        assert result.ok, result.error
        assert set(result.value) == {"question", "score"}
        assert 0 <= result.value["score"] <= 5


async def test_every_row_fails_with_a_non_retryable_error(key: None) -> None:
    with running_emulator(EmulatorConfig(faults=Faults(rate_insufficient_quota=1.0))) as emu:
        processor = LLMProcessor(llm_config(base_url=emu.openai_base_url, model="m"))
        output = LLMOutput(name="caption", prompt="{{ text }}")
        try:
            results = await processor.process(output, requests("caption", ["a", "b", "c"]))
        finally:
            await processor.aclose()
    assert len(results) == 3
    for result in results:
        assert result.value is None and not result.ok and not result.retryable
        assert "insufficient_quota" in (result.error or "")


async def test_an_empty_prompt_is_that_rows_error(emulator: Any, key: None) -> None:
    processor = LLMProcessor(llm_config(base_url=emulator.openai_base_url, model="m"))
    try:
        results = await processor.process(
            LLMOutput(name="c", prompt="{{ text }}"), requests("c", ["ok", ""])
        )
    finally:
        await processor.aclose()
    assert results[0].value == "echo: ok"
    assert results[1].value is None and "empty" in (results[1].error or "")


def test_sampling_and_pacing_are_mapped() -> None:
    config = llm_config(
        base_url="http://127.0.0.1:1/v1",
        model="m",
        default_sampling_params={
            "temperature": 0.3,
            "top_p": 0.9,
            "max_new_tokens": 64,
            "seed": 7,
            "stop": ["\n"],
            "top_k": 20,
        },
        worker_concurrency=5,
        rpm=100,
        tpm=1000,
        max_retries=2,
        request_timeout=9.5,
    )
    llm = LLMProcessor(config).llm
    assert llm.sampling == {
        "temperature": 0.3,
        "top_p": 0.9,
        "max_tokens": 64,
        "seed": 7,
        "stop": ["\n"],
        "top_k": 20,
    }
    assert llm.config.worker_concurrency == 5
    assert (llm.config.rpm, llm.config.tpm) == (100, 1000)
    assert (llm.config.max_retries, llm.config.request_timeout) == (2, 9.5)
    assert llm.config.on_failure == "record"


def test_build_time_failures() -> None:
    with pytest.raises(MissingAPIKeyError, match="OPENAI_API_KEY"):
        build_processor(llm_config(message_format="openai", model="gpt-4.1-mini"))
    with pytest.raises(ConfigError, match="where the model runs"):
        build_processor(llm_config(model="m"))
    with pytest.raises(ConfigError, match="model"):
        build_processor(llm_config(base_url="http://127.0.0.1:1/v1"))
    if not any(importlib.util.find_spec(m) for m in ("sglang", "vllm")):
        not_here = r"needs a server engine \(SGLang or vLLM\), which is not installed here"
        with pytest.raises(ConfigError, match=not_here):
            build_processor(llm_config(server_args={"model_path": "Qwen/Qwen3-8B"}))
    with pytest.raises(ConfigError, match="max_new_tokens and max_tokens disagree"):
        build_processor(
            llm_config(
                base_url="http://127.0.0.1:1/v1",
                model="m",
                default_sampling_params={"max_tokens": 1, "max_new_tokens": 2},
            )
        )
    image_gen = build(
        ImageGenProcessorConfig,
        {"type": "image_gen", "external": {"base_url": "http://x"}},
        ("processors", 0),
        SOURCE,
    )
    with pytest.raises(ConfigError, match="not supported yet by this runner"):
        build_processor(image_gen)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp missing")
async def test_local_model_on_two_rows() -> None:
    config = llm_config(
        message_format="local", default_sampling_params={"max_tokens": 8, "temperature": 0}
    )
    processor = LLMProcessor(config)
    try:
        results = await processor.process(
            LLMOutput(name="c", prompt="{{ text }}"), requests("c", ["Name a colour.", "Hi."])
        )
    finally:
        await processor.aclose()
    assert all(r.ok and isinstance(r.value, str) and r.output_tokens > 0 for r in results)


# -- custom -------------------------------------------------------------------------------------

SCRIPT = """
import time

def upper(variables):
    return variables["text"].upper()

def with_row(variables, row):
    return {"var": variables["text"], "raw": row["raw_text"], "id": row["id"]}

def fails_on_b(variables):
    if variables["text"] == "b":
        raise ValueError("no b")
    return variables["text"]

def slow_on_b(variables):
    if variables["text"] == "b":
        time.sleep(30)
    return variables["text"]

def hangs_on_b(variables):
    import signal
    if variables["text"] == "b":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})  # ignores the alarm
        time.sleep(30)
    time.sleep(0.4)
    return variables["text"]

not_a_function = 3
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("custom") / "funcs.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


async def run_custom(
    script: Path, prompts: list[str], **raw: Any
) -> tuple[CustomProcessor, list[Any]]:
    grace = raw.pop("grace", 5.0)
    processor = CustomProcessor(custom_config(script_path=str(script), **raw), hard_grace_s=grace)
    try:
        results = await processor.process(CustomOutput(name="c"), requests("c", prompts))
    finally:
        await processor.aclose()
    return processor, results


async def test_custom_values_in_order(script: Path) -> None:
    processor = build_processor(
        custom_config(script_path=str(script), function_name="upper", max_workers=2)
    )
    try:
        results = await processor.process(CustomOutput(name="c"), requests("c", ["a", "b", "c"]))
    finally:
        await processor.aclose()
    assert [(r.value, r.error) for r in results] == [("A", None), ("B", None), ("C", None)]


async def test_two_parameter_function_receives_the_raw_row(script: Path) -> None:
    _, results = await run_custom(script, ["a"], function_name="with_row")
    assert results[0].value == {"var": "a", "raw": "a", "id": 0}


async def test_a_raising_function_records_the_error_and_trips_the_breaker(script: Path) -> None:
    processor, results = await run_custom(
        script, ["a", "b", "c"], function_name="fails_on_b", fallback_value={"x": None}
    )
    assert results[0].value == "a" and results[0].ok
    assert results[1].value == {"x": None} and "ValueError: no b" in (results[1].error or "")
    assert not results[1].retryable
    # max_errors defaults to 1 (the original's >=): the next row is not called.
    assert results[2].value == {"x": None} and "circuit breaker is open" in (results[2].error or "")
    assert processor.errors == 1 and processor.breaker is not None


async def test_errors_below_max_errors_keep_calling(script: Path) -> None:
    processor, results = await run_custom(
        script, ["b", "a", "b", "c"], function_name="fails_on_b", max_errors=3
    )
    assert [r.value for r in results] == [None, "a", None, "c"]
    assert processor.errors == 2 and processor.breaker is None


async def test_a_slow_call_times_out_to_the_fallback(script: Path) -> None:
    processor, results = await run_custom(
        script,
        ["a", "b", "c"],
        function_name="slow_on_b",
        timeout_ms=300,
        max_timeouts=2,
        fallback_value="FALLBACK",
    )
    assert [r.value for r in results] == ["a", "FALLBACK", "c"]
    assert "timed out after 300 ms" in (results[1].error or "") and results[1].retryable
    assert processor.timeouts == 1 and processor.breaker is None


async def test_a_call_that_ignores_the_alarm_is_killed_and_the_pool_restarts(
    script: Path,
) -> None:
    # "b" blocks SIGALRM, so only the parent's hard deadline (0.6 s + 3 s) stops it; "c" may
    # still be running in the other worker when the pool is killed, and then runs again in the
    # new one. The parent's deadline counts from submission (worker start-up included), so the
    # grace is wide enough for "a" and "c" to be done on a busy machine.
    processor, results = await run_custom(
        script,
        ["b", "a", "c"],
        function_name="hangs_on_b",
        timeout_ms=600,
        max_timeouts=5,
        max_workers=2,
        fallback_value="F",
        grace=3.0,
    )
    assert [r.value for r in results] == ["F", "a", "c"]
    assert "timed out" in (results[0].error or "")
    assert processor.timeouts == 1 and processor.breaker is None


async def test_the_breaker_opens_after_max_timeouts(script: Path) -> None:
    processor, results = await run_custom(
        script, ["b", "a"], function_name="slow_on_b", timeout_ms=200, fallback_value=0
    )
    assert results[0].value == 0 and "timed out" in (results[0].error or "")
    assert results[1].value == 0 and "circuit breaker is open" in (results[1].error or "")
    assert "max_timeouts is 1" in (processor.breaker or "")


def test_bad_script_or_function_fails_at_build(script: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    with pytest.raises(ConfigError, match=r"script_path: the script .*nope\.py does not exist"):
        build_processor(custom_config(script_path=str(missing), function_name="f"))
    with pytest.raises(ConfigError, match=r"function_name: .*funcs\.py has no function 'absent'"):
        build_processor(custom_config(script_path=str(script), function_name="absent"))
    with pytest.raises(ConfigError, match=r"'not_a_function' in .*funcs\.py is not a function"):
        build_processor(custom_config(script_path=str(script), function_name="not_a_function"))
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    with pytest.raises(
        ConfigError, match=r"script_path: .*broken\.py could not be loaded: SyntaxError"
    ):
        build_processor(custom_config(script_path=str(broken), function_name="f"))
