"""``deliver``'s ``take`` and its plain-answer entry: the same result either way."""

from __future__ import annotations

from typing import Any

from mmirage.core.process.base import OutputResult, Take, answer_of


def test_a_plain_callable_gets_the_answer_as_an_output_result() -> None:
    got: list[tuple[int, OutputResult]] = []
    answer_of(lambda index, result: got.append((index, result)))(3, "text", 5, 7)
    assert got == [(3, OutputResult(value="text", input_tokens=5, output_tokens=7))]


def test_a_take_answers_through_its_own_entry_and_results_through_its_call() -> None:
    answers: list[tuple[int, Any, int, int]] = []
    results: list[tuple[int, OutputResult]] = []

    def answer(index: int, value: Any, tokens_in: int, tokens_out: int) -> None:
        answers.append((index, value, tokens_in, tokens_out))

    take = Take(lambda index, result: results.append((index, result)), answer)
    answer_of(take)(1, "a", 2, 3)
    take(4, OutputResult(error="refused"))
    assert answers == [(1, "a", 2, 3)]
    assert results == [(4, OutputResult(error="refused"))]
