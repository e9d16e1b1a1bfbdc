"""Why a row failed, and never buying the same failure twice: over real HTTP to the emulator.

A JSON answer cut at the token limit is ``truncated`` (asked once), one that misses the schema
is re-asked with its error, then ``validation``; neither is retryable, while a 500 or a 429
still is. ``finish_reason`` arrives for every provider, live and batch, on failures too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel

from conftest import TEST_KEY
from llm_kit import LLM, BatchConfig, BatchItem, BatchResult, Message, Usage
from llm_kit.answers import ORDINARY_STOPS, max_tokens_of, truncated_error
from llm_kit.providers.batch_backend import Outcome
from llm_kit.types import Completion
from mmirage.core.process.base import OutputResult, Take
from mmirage.core.process.batch.adapters.wire import result_row
from mmirage.core.process.batch.batch_records import RequestOutcome, result_line
from mmirage.core.process.llm_processor import _results_to, _to_output_result
from mmirage.core.shard.report import failed_summary
from provider_emulator import EmulatorConfig, Faults, running_emulator
from provider_emulator.responder import OFF_SCHEMA_TEXT

FORMATS = ["openai", "anthropic", "gemini"]
# Each provider's word for an answer stopped by the token limit, and for a normal end.
CUT = {"openai": "length", "anthropic": "max_tokens", "gemini": "MAX_TOKENS"}
STOP = {"openai": "stop", "anthropic": "end_turn", "gemini": "STOP"}


class Review(BaseModel):
    summary: str
    verdict: str


def make_llm(
    emu: Any, fmt: str, max_tokens: int | None = 8, model_held: bool = False, **config: Any
) -> LLM:
    """``model_held``: the schema is held by the model alone (the ``prompt`` form on OpenAI),
    so that the emulator's ``invalid_json`` answers are the model's misses; under a form that
    carries the schema, they would show the form ignored (llm_kit.dialect_choice)."""
    return LLM(
        model="test-model",
        message_format=fmt,
        base_url=emu.openai_base_url if fmt == "openai" else emu.url,
        api_key=TEST_KEY,
        max_tokens=max_tokens,
        config=BatchConfig(**{"retry_base_delay": 0.01, "retry_max_delay": 0.05, **config}),
        structured_output="prompt" if model_held and fmt == "openai" else "auto",
    )


def conversation(request: dict[str, Any]) -> list[dict[str, Any]]:
    """A recorded request's turns, without the system message the prompt form adds."""
    return [m for m in request["messages"] if m["role"] != "system"]


def review(item_id: str = "r") -> BatchItem:
    return BatchItem(item_id, [Message.user("Review this film in detail.")], Review)


@pytest.fixture(scope="module")
def recorder() -> Iterator[Any]:
    """The echo responder, every live request kept."""
    with running_emulator(EmulatorConfig(record_requests=True)) as emu:
        yield emu


@pytest.fixture
def emu(recorder: Any) -> Any:
    recorder.reset_stats()  # zero counts, no requests of an earlier test
    return recorder


# -- a JSON answer cut at the token limit -------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_cut_json_answer_is_truncated_asked_once_and_not_retryable(
    emu: Any, fmt: str
) -> None:
    llm = make_llm(emu, fmt, max_tokens=8, validation_retries=3)
    result = await llm.run_item(review())
    await llm.aclose()
    assert not result.ok and result.error_kind == "truncated" and not result.retryable
    assert result.finish_reason == CUT[fmt]
    assert result.error == (
        f"the answer was cut at the token limit (finish_reason '{CUT[fmt]}'): "
        "raise max_new_tokens (now 8)"
    )
    assert result.attempts == 1 and emu.stats()["requests"] == 1  # never re-asked: same cut
    assert result.usage is not None and result.usage.output_tokens > 0


async def test_a_cut_answer_without_a_configured_limit_says_to_set_one() -> None:
    class Long(BaseModel):  # about 1,700 characters of echo: more than the default 256 tokens
        fields: list[str]
        a: str
        b: str
        c: str
        d: str
        e: str
        f: str
        g: str
        h: str
        i: str
        j: str
        k: str
        l: str  # noqa: E741 - one letter per field
        m: str
        n: str
        o: str
        p: str
        q: str
        r: str
        s: str
        t: str

    with running_emulator() as emu:
        llm = make_llm(emu, "openai", max_tokens=None)
        result = await llm.run_item(BatchItem("x", [Message.user("y" * 80)], Long))
        await llm.aclose()
    assert result.error_kind == "truncated" and result.error is not None
    assert result.error.endswith("): set max_new_tokens")


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_plain_text_answer_cut_at_the_limit_stays_an_answer(emu: Any, fmt: str) -> None:
    llm = make_llm(emu, fmt, max_tokens=2)
    cut = await llm.run_item(BatchItem("t", [Message.user("a long question " * 5)]))
    whole = await llm.run_item(BatchItem("w", [Message.user("hi")], sampling={"max_tokens": 64}))
    await llm.aclose()
    assert cut.ok and cut.finish_reason == CUT[fmt] and cut.response == "echo: a "
    assert whole.ok and whole.finish_reason == STOP[fmt]


# -- an answer that misses the schema -------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_validation_miss_is_re_asked_with_the_answer_and_the_error(fmt: str) -> None:
    config = EmulatorConfig(invalid_json="first", record_requests=True)
    with running_emulator(config) as emu:
        llm = make_llm(emu, fmt, max_tokens=512, model_held=True)
        result = await llm.run_item(review())
        await llm.aclose()
        sent = emu.requests()
    assert result.ok and isinstance(result.response, Review), result.error
    assert result.attempts == 2 and len(sent) == 2
    assert result.finish_reason == STOP[fmt]
    first, second = (conversation(request) for request in sent)
    assert [m["role"] for m in first] == ["user"]
    # The conversation, the rejected answer as the assistant's turn, then what was wrong.
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[0] == first[0] and second[1]["content"] == OFF_SCHEMA_TEXT
    correction = second[2]["content"]
    assert "does not match Review" in correction and '"verdict"' in correction
    assert "matches this JSON schema" in correction


@pytest.mark.parametrize("fmt", FORMATS)
async def test_an_answer_that_never_validates_fails_for_good(fmt: str) -> None:
    with running_emulator(EmulatorConfig(invalid_json="always", record_requests=True)) as emu:
        llm = make_llm(emu, fmt, max_tokens=512, model_held=True, validation_retries=2)
        result = await llm.run_item(review())
        await llm.aclose()
        sent = emu.requests()
        assert emu.stats()["requests"] == 3  # the first ask and two re-asks, then no more
    assert not result.ok and result.error_kind == "validation" and not result.retryable
    assert result.finish_reason == STOP[fmt] and result.attempts == 3
    assert "does not match Review" in (result.error or "")
    # Each re-ask carries the whole exchange so far.
    assert [len(conversation(request)) for request in sent] == [1, 3, 5]


async def test_retry_failed_does_not_buy_a_failure_for_good_again(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with running_emulator(EmulatorConfig(invalid_json="always")) as emu:
        llm = make_llm(emu, "openai", max_tokens=512, model_held=True, validation_retries=1)
        items = [review("bad"), review("cut")]
        items[1].sampling = {"max_tokens": 4}
        await llm.batch_to_jsonl(items, out)
        assert emu.stats()["requests"] == 3  # bad: asked and re-asked once; cut: once
        assert await llm.batch_to_jsonl(items, out, retry_failed=True) == 0
        assert emu.stats()["requests"] == 3
    lines = {line["id"]: line for line in map(orjson.loads, out.read_bytes().splitlines())}
    assert lines["bad"]["error_kind"] == "validation" and lines["bad"]["finish_reason"] == "stop"
    assert lines["cut"]["error_kind"] == "truncated" and lines["cut"]["finish_reason"] == "length"
    assert not lines["bad"]["retryable"] and not lines["cut"]["retryable"]


async def test_the_local_engine_reports_a_cut_json_answer_as_truncated() -> None:
    pytest.importorskip("llama_cpp")
    llm = LLM(model="local", message_format="local", max_tokens=3, temperature=0)
    result = await llm.run_item(review())
    text = await llm.run_item(BatchItem("t", [Message.user("Tell me a long story.")]))
    assert not result.ok and result.error_kind == "truncated" and not result.retryable
    assert result.finish_reason == "length" and result.attempts == 1
    assert (result.error or "").endswith("raise max_new_tokens (now 3)")
    assert text.ok and text.finish_reason == "length"


# -- transient failures stay retryable ----------------------------------------------------------


@pytest.mark.parametrize("fault", ["rate_500", "rate_429"])
@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_transient_failure_that_exhausts_its_retries_stays_retryable(
    fmt: str, fault: str
) -> None:
    faults = Faults(**{fault: 1.0, "retry_after_s": 0.0})
    with running_emulator(EmulatorConfig(faults=faults)) as emu:
        llm = make_llm(emu, fmt, max_retries=1)
        result = await llm.run_item(review())
        await llm.aclose()
        assert emu.stats()["requests"] == 2
    assert not result.ok and result.retryable and result.attempts == 2
    assert result.error_kind not in ("truncated", "validation") and result.finish_reason is None


# -- the provider batch API -----------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
async def test_batch_results_carry_finish_reason_and_permanent_kinds(
    fmt: str, tmp_path: Path
) -> None:
    items = [
        BatchItem("text", [Message.user("hi")], sampling={"max_tokens": 64}),
        BatchItem("cut", [Message.user("Review this film.")], Review, sampling={"max_tokens": 4}),
        BatchItem("whole", [Message.user("Review.")], Review, sampling={"max_tokens": 512}),
    ]
    with running_emulator() as emu:
        llm = make_llm(emu, fmt, max_tokens=None)
        job = await llm.submit_batch(items, spool_dir=tmp_path / "spool")
        await llm.poll_batch(job)
        results = {r.id: r async for r in llm.fetch_batch_results(job, items=items)}
        assert await llm.resubmit_failed(job, items) == 0  # a truncated answer is not resent
        await llm.aclose()
    assert results["text"].ok and results["text"].finish_reason == STOP[fmt]
    assert results["whole"].ok and isinstance(results["whole"].response, Review)
    cut = results["cut"]
    assert not cut.ok and cut.error_kind == "truncated" and not cut.retryable
    assert cut.finish_reason == CUT[fmt] and cut.usage is not None


async def test_batch_answers_that_miss_the_schema_fail_for_good(tmp_path: Path) -> None:
    items = [review(f"r{i}") for i in range(3)]
    with running_emulator(EmulatorConfig(invalid_json="always")) as emu:
        llm = make_llm(emu, "openai", max_tokens=512)
        out = tmp_path / "out.jsonl"
        assert await llm.run_batch_api(items, out, poll_interval=0.02, retry_failed=True) == 3
        assert emu.stats()["batches"] == {"openai": 1}  # no resubmission round
        await llm.aclose()
    for line in map(orjson.loads, out.read_bytes().splitlines()):
        assert line["error_kind"] == "validation" and not line["retryable"]
        assert line["finish_reason"] == "stop"


# -- the sentence and its limit -------------------------------------------------------------


def test_the_truncated_sentence_names_the_limit_when_known() -> None:
    assert max_tokens_of({"max_tokens": 64}) == 64
    assert max_tokens_of({"max_completion_tokens": 32}) == 32
    assert max_tokens_of({"temperature": 0}) is None and max_tokens_of(None) is None
    assert truncated_error("length", 64) == (
        "the answer was cut at the token limit (finish_reason 'length'): "
        "raise max_new_tokens (now 64)"
    )
    assert truncated_error("MAX_TOKENS", None).endswith("'MAX_TOKENS'): set max_new_tokens")


# -- mmirage: OutputResult, the fast path, the batch results store, the reports --------------


def _result(**fields: Any) -> BatchResult:
    base: dict[str, Any] = {"id": "k:out", "ok": True, "metadata": {"index": 0}}
    return BatchResult(**{**base, **fields})


def test_output_results_carry_finish_reason_and_kind() -> None:
    truncated = _to_output_result(
        _result(
            ok=False,
            error="the answer was cut at the token limit (finish_reason 'length'): set x",
            error_kind="truncated",
            finish_reason="length",
            usage=Usage(5, 8),
        )
    )
    assert truncated.kind == "truncated" and not truncated.retryable
    assert truncated.finish_reason == "length" and truncated.output_tokens == 8
    limited = _to_output_result(
        _result(ok=False, error="429", error_kind="rate_limit", retryable=True)
    )
    assert limited.kind == "rate_limit" and limited.retryable and limited.finish_reason is None
    answer = _to_output_result(_result(response=" hi ", finish_reason="stop", usage=Usage(1, 1)))
    assert answer.ok and answer.value == "hi" and answer.finish_reason == "stop"
    assert answer.kind is None


def test_the_fast_path_takes_only_plain_answers_that_ended_normally() -> None:
    answers: list[tuple[int, Any]] = []
    results: list[OutputResult] = []
    take = Take(lambda i, r: results.append(r), lambda i, v, tin, tout: answers.append((i, v)))
    on_result = _results_to(take)
    for reason in ("stop", "end_turn", "STOP", None):
        on_result(_result(response="ok", usage=Usage(1, 1), finish_reason=reason))
    on_result(_result(response="cut off", usage=Usage(1, 1), finish_reason="length"))
    assert answers == [(0, "ok")] * 4
    assert len(results) == 1 and results[0].finish_reason == "length"
    assert results[0].value == "cut off" and results[0].ok
    assert None in ORDINARY_STOPS


def test_batch_result_rows_keep_the_finish_reason_for_merge(tmp_path: Path) -> None:
    from mmirage.core.process.batch.batch_records import BatchRecord
    from mmirage.core.process.batch.results_store import ResultsStore

    cut = Completion('{"summary": "a lo', Usage(3, 4), finish_reason="length", cut=True)
    row = result_row(Outcome("answer-json-7", completion=cut))
    assert row["status"] == "succeeded" and row["finish_reason"] == "length"
    assert result_line(1, row)[-1] == "length"
    with ResultsStore(tmp_path / "results.sqlite") as store:
        store.add_batch(BatchRecord("openai", "b1"), ["answer-json-7"])
        store.store_results("openai", "b1", [row], unanswered=("missing", "none"))
        outcome = store.lookup(["answer-json-7"])["answer-json-7"]
    assert outcome.ok and outcome.finish_reason == "length" and outcome.cut
    assert outcome.invalid_reason("not valid JSON", 64) == (
        "the answer was cut at the token limit (finish_reason 'length'): raise max_tokens (now 64)"
    )
    plain = RequestOutcome("x", "succeeded", "{}", finish_reason="stop")
    assert not plain.cut and plain.invalid_reason("not valid JSON") == "not valid JSON"


def test_a_store_made_before_finish_reason_gets_the_column(tmp_path: Path) -> None:
    import sqlite3

    from mmirage.core.process.batch.results_store import ResultsStore

    path = tmp_path / "old.sqlite"
    with ResultsStore(path):
        pass
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE results DROP COLUMN finish_reason")
    db.commit()
    db.close()
    with ResultsStore(path) as store:
        assert store.lookup(["a-1"])["a-1"].state == "missing"
    columns = {row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(results)")}
    assert "finish_reason" in columns


def test_check_counts_failures_for_good_apart_from_retryable_ones() -> None:
    assert failed_summary(0, 0) == "0 failed"
    assert failed_summary(5, 2) == (
        "5 failed: 3 for good (validation, truncated, refused…), "
        "2 retryable (rate limit, server error, timeout…)"
    )
    assert failed_summary(2, 0) == "2 failed: 2 for good (validation, truncated, refused…)"
    assert failed_summary(1, 1) == "1 failed: 1 retryable (rate limit, server error, timeout…)"
