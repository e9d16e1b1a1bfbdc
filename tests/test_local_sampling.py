"""The embedded engine's sampling: a JSON grammar asked about the chosen token first."""

from __future__ import annotations

import ctypes
import json
from typing import Any

import numpy as np
import pytest

from llm_kit.local import LocalEngine, default_model_path
from llm_kit.local.candidates import Candidates
from llm_kit.local.sampling import PENALTY_LAST_N, greedy_token

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


@pytest.mark.parametrize("penalty", [1.1, 1.3, 0.9, 1.0])
def test_greedy_with_the_repeat_penalty_picks_what_llama_cpp_picks(penalty: float) -> None:
    # The engine picks temperature-0 tokens with numpy; llama.cpp's own chain (penalties, then
    # greedy) over the same logits and the same recent tokens must choose the same token,
    # ties and penalised maxima included.
    from collections import deque

    from llama_cpp._internals import LlamaSampler

    rng = np.random.default_rng(7)
    n_vocab = 4096
    candidates = Candidates(llama_cpp, n_vocab)
    for case in range(200):
        logits = rng.normal(0, 3, n_vocab).astype(np.float32)
        recent = [int(t) for t in rng.integers(0, n_vocab, 90)]  # longer than the window
        best = {
            0: recent[-1],  # the newest token: the penalty decides whether it stays best
            1: recent[-40],  # inside the window
            2: recent[0],  # older than the window: not penalised (unless seen again since)
            3: 100,  # a tie with 200
        }[case % 4]
        logits[best] = logits.max() + np.float32(rng.uniform(0, 0.4))
        logits[200] = logits[100] if case % 4 == 3 else logits[200]
        if case % 3 == 0:  # all below zero: a penalised logit is multiplied, not divided
            logits -= logits.max() + np.float32(0.5)
        chain = LlamaSampler()
        chain.add_penalties(n_vocab, PENALTY_LAST_N, penalty, 0.0, 0.0)
        chain.add_greedy()
        for token in recent:
            llama_cpp.llama_sampler_accept(chain.sampler, token)
        pointer = logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        llama_cpp.llama_sampler_apply(chain.sampler, candidates.fill(pointer))
        want = candidates.selected()
        chain.close()
        window = deque(recent, maxlen=PENALTY_LAST_N)
        assert greedy_token(logits, window, penalty) == want, f"case {case}"
