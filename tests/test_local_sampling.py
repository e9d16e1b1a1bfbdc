"""The embedded engine's sampling: a JSON grammar asked about the chosen token first."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llm_kit.local import LocalEngine, default_model_path

llama_cpp = pytest.importorskip("llama_cpp")

SENTIMENT = {
    "type": "object",
    "properties": {
        "label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "summary": {"type": "string"},
    },
    "required": ["label", "summary"],
}
REVIEWS = ["great phone, slow shipping", "awful taste", "it works", "I love this bike"]


def chat(review: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"Review: {review}. Give the sentiment as JSON."}]


def test_json_answers_at_temperature_zero_equal_llama_cpp_pythons_own() -> None:
    # llama-cpp-python puts the grammar in the chain and filters every token at every step;
    # the engine asks the grammar about its first pick only. Greedy answers must not differ.
    reference = llama_cpp.Llama(
        str(default_model_path()), n_ctx=2048, flash_attn=True, verbose=False
    )
    want = [
        reference.create_chat_completion(
            chat(review),
            temperature=0,
            max_tokens=64,
            repeat_penalty=1.1,
            response_format={"type": "json_object", "schema": SENTIMENT},
        )["choices"][0]["message"]["content"]
        for review in REVIEWS
    ]
    reference.close()
    engine = LocalEngine(slots=1)
    try:
        answers = [
            engine.complete_sync(chat(review), max_tokens=64, json_schema=SENTIMENT)
            for review in REVIEWS
        ]
        full_passes = engine.stats.grammar_full_passes
    finally:
        engine.close()
    assert [a.text for a in answers] == want
    assert all(json.loads(a.text or "")["label"] for a in answers)
    # Both ways were taken: the grammar refused some first picks and allowed most.
    assert 0 < full_passes < sum(a.usage.output_tokens for a in answers) // 2
