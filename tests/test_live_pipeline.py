"""The spec's live half, as written, over real HTTP to the emulator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from pydantic import BaseModel, field_validator

from conftest import TEST_KEY
from llm_kit import (
    LLM,
    BatchConfig,
    BatchItem,
    BatchItemFailed,
    BatchResult,
    ConfigError,
    Message,
    MissingAPIKeyError,
    ProviderError,
)


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: float


class Caption(BaseModel):
    caption: str
    tags: list[str]


def make_llm(emulator: Any, fmt: str = "openai", **config: Any) -> LLM:
    base = {"openai": emulator.openai_base_url}.get(fmt, emulator.anthropic_base_url)
    return LLM(
        model="test-model",
        message_format=fmt,
        base_url=base,
        api_key=TEST_KEY,
        max_tokens=32,
        config=BatchConfig(**{"worker_concurrency": 16, **config}),
    )


def spec_items(n: int) -> list[BatchItem]:
    # As on the spec page: per-item schemas, images by URL.
    return [
        BatchItem(
            id=f"item-{i:06d}",
            messages=[Message.user("Caption:", image_urls=["https://example.com/cat.jpg"])],
            response_model=Sentiment if i % 2 else Caption,
            metadata={"row": i},
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "gemini"])
async def test_batch_stream_yields_validated_models_for_every_provider(
    emulator: Any, fmt: str
) -> None:
    llm = make_llm(emulator, fmt)
    seen: dict[str, BatchResult] = {}
    async for result in llm.batch_stream(spec_items(40)):
        if result.ok:
            seen[result.id] = result
        else:
            pytest.fail(f"{result.id}: {result.error}")
    await llm.aclose()
    assert len(seen) == 40
    assert isinstance(seen["item-000001"].response, Sentiment)
    assert isinstance(seen["item-000002"].response, Caption)
    assert seen["item-000003"].metadata == {"row": 3}
    assert seen["item-000003"].usage is not None and seen["item-000003"].usage.input_tokens > 0


async def test_batch_to_jsonl_writes_every_item_once(emulator: Any, tmp_path: Path) -> None:
    llm = make_llm(emulator)
    out = tmp_path / "out.jsonl"
    written = await llm.batch_to_jsonl(spec_items(100), out, resume=True)
    assert written == 100
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["id"] for r in lines) == [f"item-{i:06d}" for i in range(100)]
    assert all(r["ok"] for r in lines)
    # Running again with resume=True sends nothing: the output is the checkpoint.
    before = emulator.stats()["requests"]
    assert await llm.batch_to_jsonl(spec_items(100), out, resume=True) == 0
    assert emulator.stats()["requests"] == before
    await llm.aclose()


async def test_resume_repairs_a_torn_last_line_without_duplicates(
    emulator: Any, tmp_path: Path
) -> None:
    llm = make_llm(emulator)
    out = tmp_path / "out.jsonl"
    await llm.batch_to_jsonl(spec_items(10), out)
    data = out.read_bytes()
    lines = data.splitlines(keepends=True)
    out.write_bytes(b"".join(lines[:6]) + lines[6][:25])  # a crash mid-line
    torn_id = orjson.loads(lines[6])["id"]
    written = await llm.batch_to_jsonl(spec_items(10), out, resume=True)
    assert written == 4
    ids = [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 10
    assert torn_id in ids
    await llm.aclose()


async def test_existing_output_without_resume_is_refused(emulator: Any, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"id":"x","ok":true,"retryable":false}\n')
    with pytest.raises(ConfigError, match="already holds results; pass resume=True"):
        await make_llm(emulator).batch_to_jsonl(spec_items(1), out)
    assert out.read_text().count("\n") == 1  # nothing paid for was overwritten


async def test_batch_to_callback_accepts_sync_and_async_callbacks(emulator: Any) -> None:
    llm = make_llm(emulator)
    saved: list[str] = []
    count = await llm.batch_to_callback(spec_items(20), lambda r: saved.append(r.id))
    assert count == 20 and len(set(saved)) == 20

    async def save(result: BatchResult) -> None:
        await asyncio.sleep(0)
        saved.append(result.id)

    assert await llm.batch_to_callback(spec_items(5), save) == 5
    assert len(saved) == 25
    await llm.aclose()


async def test_async_iterable_input(emulator: Any) -> None:
    async def source() -> AsyncIterator[BatchItem]:
        for item in spec_items(30):
            await asyncio.sleep(0)
            yield item

    ids = [r.id async for r in make_llm(emulator).batch_stream(source())]
    assert len(set(ids)) == 30


async def test_generator_is_consumed_lazily_with_bounded_read_ahead(emulator: Any) -> None:
    """Memory is O(worker_concurrency + input_buffer_size): the source is never materialised."""
    pulled = 0
    max_outstanding = 0
    finished = 0

    def source() -> Iterator[BatchItem]:
        nonlocal pulled
        for i in range(2000):
            pulled += 1
            yield BatchItem(f"g{i}", [Message.user(f"hello {i}")])

    async for _ in make_llm(emulator, worker_concurrency=8, input_buffer_size=16).batch_stream(
        source()
    ):
        finished += 1
        max_outstanding = max(max_outstanding, pulled - finished)
    assert finished == 2000
    # in flight (8) + buffered (16) + results waiting to be read (8) + the feeder's hand (1)
    assert max_outstanding <= 8 + 16 + 8 + 1


async def test_per_item_failures_are_recorded_and_the_batch_goes_on(
    emulator: Any, tmp_path: Path
) -> None:
    items = spec_items(6)
    items[2] = BatchItem("bad-image", [Message.user("x", image_urls=[str(tmp_path / "no.png")])])
    results = {r.id: r async for r in make_llm(emulator).batch_stream(items)}
    assert len(results) == 6
    bad = results["bad-image"]
    assert (
        not bad.ok and bad.error_kind == "invalid_item" and "cannot read image" in (bad.error or "")
    )
    assert sum(r.ok for r in results.values()) == 5


async def test_on_failure_raise_is_fail_fast(emulator: Any, tmp_path: Path) -> None:
    items = [BatchItem("bad", [Message.user("x", image_urls=[str(tmp_path / "no.png")])])]
    items += spec_items(50)
    llm = make_llm(emulator, on_failure="raise", worker_concurrency=1)
    with pytest.raises(BatchItemFailed, match="'bad' failed: cannot read image"):
        async for _ in llm.batch_stream(items):
            pass


async def test_validation_failure_is_retried_then_recorded(emulator: Any) -> None:
    # The echo responder answers schema-valid JSON; a model that rejects it shows the retry path.
    class Picky(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def reject(cls, value: int) -> int:
            raise ValueError("picky")

    llm = make_llm(emulator, validation_retries=2)
    before = emulator.stats()["requests"]
    result = await llm.run_item(BatchItem("v", [Message.user("x")], response_model=Picky))
    # Re-asked with what was wrong, then failed for good: a rerun would buy the same answer.
    assert not result.ok and result.error_kind == "validation" and not result.retryable
    assert result.attempts == 3  # the first try and two validation retries
    assert result.finish_reason == "stop"
    assert emulator.stats()["requests"] - before == 3
    assert "picky" in (result.error or "")
    await llm.aclose()


async def test_a_validator_that_crashes_fails_its_item_not_the_batch(emulator: Any) -> None:
    class Crashing(BaseModel):
        n: int

        @field_validator("n")
        @classmethod
        def lookup(cls, value: int) -> int:
            return {}[value]  # type: ignore[no-any-return]  # a KeyError, not a ValueError

    items = spec_items(6)
    items[3] = BatchItem("crash", [Message.user("x")], response_model=Crashing)
    llm = make_llm(emulator, validation_retries=0)
    results = {r.id: r async for r in llm.batch_stream(items)}
    await llm.aclose()
    crash = results.pop("crash")
    assert not crash.ok and crash.error_kind == "validation"
    assert "a validator of Crashing raised KeyError" in (crash.error or "")
    assert len(results) == 5 and all(r.ok for r in results.values())


async def test_numpy_numbers_in_an_items_sampling_are_sent_as_json_numbers(
    emulator: Any,
) -> None:
    import numpy as np

    sweep = [
        BatchItem(f"t{i}", [Message.user("x")], sampling={"temperature": np.float64(t)})
        for i, t in enumerate(np.linspace(0, 1, 3))
    ]
    results = [r async for r in make_llm(emulator).batch_stream(sweep)]
    assert len(results) == 3 and all(r.ok for r in results)


async def test_complete_single_call(emulator: Any) -> None:
    llm = make_llm(emulator)
    text = await llm.complete("Say hi")
    assert isinstance(text, str) and text
    model = await llm.complete([Message.user("rate it")], response_model=Sentiment)
    assert isinstance(model, Sentiment)
    await llm.aclose()


def test_missing_key_and_unknown_format_fail_before_any_request() -> None:
    with pytest.raises(MissingAPIKeyError, match="set OPENAI_API_KEY"):
        LLM(model="gpt-4o-mini")
    with pytest.raises(MissingAPIKeyError, match="GEMINI_API_KEY or GOOGLE_API_KEY"):
        LLM(model="gemini-2.5-flash", message_format="gemini")
    with pytest.raises(ConfigError, match="unknown message_format 'cohere'; use one of: openai"):
        LLM(model="x", message_format="cohere")


def test_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", TEST_KEY)
    llm = LLM(model="claude", message_format="anthropic")
    assert TEST_KEY not in repr(llm)


async def test_rejected_key_stops_the_batch(emulator: Any) -> None:
    llm = LLM(model="m", base_url=emulator.openai_base_url)  # no key: the emulator says 401
    with pytest.raises(ProviderError, match=r"401.*API key was rejected"):
        async for _ in llm.batch_stream(spec_items(10)):
            pass
    await llm.aclose()
