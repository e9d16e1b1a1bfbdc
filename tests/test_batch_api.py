"""The spec's provider-batch section, as written, for OpenAI, Anthropic and Gemini, over real
HTTP to the emulator's batch endpoints."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from pydantic import BaseModel

from llm_kit import LLM, BatchConfig, BatchItem, BatchJob, ConfigError, Message
from llm_kit.batch import BatchNotFinishedError, JobState
from llm_kit.providers.gemini_batch import GeminiBatchBackend
from provider_emulator import EmulatorConfig, running_emulator

KEY = "sk-batch-test-key-3141"
FORMATS = ["openai", "anthropic", "gemini"]
ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]


def base_url(emu: Any, fmt: str) -> str:
    return emu.openai_base_url if fmt == "openai" else emu.anthropic_base_url


def make_llm(emu: Any, fmt: str, **config: Any) -> LLM:
    return LLM(
        model="test-model",
        message_format=fmt,
        base_url=base_url(emu, fmt),
        api_key=KEY,
        max_tokens=32,
        config=BatchConfig(**config),
    )


def make_items(n: int) -> list[BatchItem]:
    return [
        BatchItem(
            id=f"item-{i:06d}",
            messages=[Message.user(f"Review {i}: sentiment?")],
            response_model=Sentiment if i % 2 else None,
            metadata={"row": i},
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def emu() -> Iterator[Any]:
    with running_emulator(EmulatorConfig(seed=5)) as handle:
        yield handle


@pytest.mark.parametrize("fmt", FORMATS)
async def test_spec_example_submit_save_load_poll_fetch(emu: Any, fmt: str, tmp_path: Path) -> None:
    llm = make_llm(emu, fmt)
    items = make_items(25)
    job = await llm.submit_batch(items, spool_dir=tmp_path / "spool")
    job.save(tmp_path / "job.json")
    assert KEY not in (tmp_path / "job.json").read_text()

    job = BatchJob.load(tmp_path / "job.json")
    status = await llm.poll_batch(job)
    assert status.state.is_terminal and status.state is JobState.COMPLETED
    assert status.counts.total == 25 and status.counts.succeeded == 25
    results = {r.id: r async for r in llm.fetch_batch_results(job, items=items)}
    await llm.aclose()
    assert len(results) == 25 and all(r.ok for r in results.values())
    assert isinstance(results["item-000001"].response, Sentiment)
    assert isinstance(results["item-000002"].response, str)
    assert results["item-000007"].metadata == {"row": 7}
    assert results["item-000007"].usage is not None


@pytest.mark.parametrize("fmt", FORMATS)
async def test_run_batch_api_one_shot_and_resume(emu: Any, fmt: str, tmp_path: Path) -> None:
    llm = make_llm(emu, fmt)
    out = tmp_path / "out.jsonl"
    written = await llm.run_batch_api(make_items(30), out, poll_interval=0.05)
    assert written == 30
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["id"] for r in lines) == [f"item-{i:06d}" for i in range(30)]
    assert all(r["ok"] for r in lines)
    assert lines[0]["response"] is not None
    # Running it again pays nothing: the job handle beside the output is reused, and the ids
    # already written are skipped.
    before = emu.stats()["batches"]
    assert await llm.run_batch_api(make_items(30), out, poll_interval=0.05) == 0
    assert emu.stats()["batches"] == before
    await llm.aclose()


async def test_fetch_refuses_a_running_job(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=30)) as slow:
        llm = make_llm(slow, "openai")
        job = await llm.submit_batch(make_items(3), spool_dir=tmp_path)
        status = await llm.poll_batch(job)
        assert not status.state.is_terminal
        with pytest.raises(BatchNotFinishedError, match="still running"):
            async for _ in llm.fetch_batch_results(job):
                pass
        await llm.aclose()


@pytest.mark.parametrize("fmt", FORMATS)
async def test_split_by_count_and_bytes_within_emulator_limits(fmt: str, tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(batch_max_requests=7, batch_max_bytes=4000)) as emu:
        llm = make_llm(emu, fmt, batch_max_requests=7, batch_max_bytes=4000)
        items = [BatchItem(f"s{i}", [Message.user("word " * (1 + i % 5 * 20))]) for i in range(40)]
        job = await llm.submit_batch(items, spool_dir=tmp_path)
        assert len(job.batches) >= 6  # 40 items at most 7 a batch, some split by bytes
        assert all(b.count <= 7 and b.bytes <= 4000 for b in job.batches)
        await llm.poll_batch(job)
        results = [r async for r in llm.fetch_batch_results(job)]
        await llm.aclose()
    assert sorted(r.id for r in results) == sorted(i.id for i in items)
    assert all(r.ok for r in results)


async def test_gemini_large_jobs_go_through_an_uploaded_file(
    monkeypatch: pytest.MonkeyPatch, emu: Any, tmp_path: Path
) -> None:
    monkeypatch.setattr(GeminiBatchBackend, "inline_max_bytes", 0)
    llm = make_llm(emu, "gemini")
    out = tmp_path / "out.jsonl"
    assert await llm.run_batch_api(make_items(12), out, poll_interval=0.05) == 12
    assert all(orjson.loads(line)["ok"] for line in out.read_bytes().splitlines())
    await llm.aclose()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "faults",
    [
        {"batch_item_error_rate": 0.3},
        {"batch_expire_rate": 0.6, "batch_expire_done_fraction": 0.5},
        {"batch_failure_rate": 0.4},
    ],
    ids=["item-errors", "expiry", "batch-failure"],
)
async def test_faults_end_with_nothing_lost_after_resubmission(
    fmt: str, faults: dict[str, float], tmp_path: Path
) -> None:
    with running_emulator(EmulatorConfig(seed=21, **faults)) as emu:
        llm = make_llm(emu, fmt, batch_max_requests=10)
        items = [BatchItem(f"f{i}", [Message.user(f"q{i}")], metadata={"i": i}) for i in range(40)]
        job = await llm.submit_batch(items, spool_dir=tmp_path / "spool")
        await llm.poll_batch(job)
        first = [r async for r in llm.fetch_batch_results(job)]
        assert len(first) == 40 and len({r.id for r in first}) == 40
        failed = [r for r in first if not r.ok]
        assert failed, "the fault did not fire: the test proves nothing"
        assert all(r.error and r.error_kind for r in failed)
        for _ in range(12):
            retryable = [
                r
                for r in [r async for r in llm.fetch_batch_results(job)]
                if not r.ok and r.retryable
            ]
            if not retryable:
                break
            assert await llm.resubmit_failed(job) == len(retryable)
            await llm.poll_batch(job)
        final = {r.id: r async for r in llm.fetch_batch_results(job)}
        await llm.aclose()
    assert len(final) == 40
    for item in items:
        result = final[item.id]
        assert result.ok or not result.retryable, result  # ok, or a reason that is final
        assert result.metadata == item.metadata
    # Successes of the first round were kept, not resubmitted.
    first_ok = {r.id for r in first if r.ok}
    assert all(final[i].ok for i in first_ok)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_cancel_keeps_what_finished(fmt: str, tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=1.0)) as emu:
        llm = make_llm(emu, fmt)
        job = await llm.submit_batch(make_items(20), spool_dir=tmp_path)
        import asyncio

        await asyncio.sleep(0.4)
        await llm.cancel_batch(job)
        for _ in range(100):
            status = await llm.poll_batch(job)
            if status.state.is_terminal:
                break
            await asyncio.sleep(0.05)
        assert status.state in (JobState.CANCELED, JobState.COMPLETED)
        results = [r async for r in llm.fetch_batch_results(job)]
        await llm.aclose()
    assert len(results) == 20
    canceled = [r for r in results if not r.ok]
    assert all(r.error_kind == "canceled" and r.retryable for r in canceled)


async def test_unknown_batch_id_is_one_sentence(emu: Any, tmp_path: Path) -> None:
    llm = make_llm(emu, "openai")
    job = await llm.submit_batch(make_items(2), spool_dir=tmp_path)
    job.batches[0].id = "batch_does_not_exist"
    with pytest.raises(ConfigError, match="does not know batch batch_does_not_exist"):
        await llm.poll_batch(job)
    await llm.aclose()


@pytest.mark.parametrize("fmt", FORMATS)
def test_fetch_from_a_fresh_process_with_only_the_key_in_env(
    emu: Any, fmt: str, tmp_path: Path
) -> None:
    import asyncio

    async def submit() -> None:
        llm = make_llm(emu, fmt)
        job = await llm.submit_batch(make_items(6), spool_dir=tmp_path / "spool")
        job.save(tmp_path / "job.json")
        await llm.aclose()

    asyncio.run(submit())
    script = textwrap.dedent(f"""
        import asyncio, json
        from llm_kit import LLM, BatchJob

        async def main():
            job = BatchJob.load({str(tmp_path / "job.json")!r})
            llm = LLM(model=job.model, message_format=job.provider, base_url=job.base_url)
            status = await llm.poll_batch(job)
            assert status.state.is_terminal, status
            rows = [r.to_dict() async for r in llm.fetch_batch_results(job)]
            print(json.dumps(rows))

        asyncio.run(main())
    """)
    env = {"PATH": "/usr/bin:/bin", ENV[fmt]: KEY}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    rows = orjson.loads(done.stdout)
    assert len(rows) == 6 and all(r["ok"] for r in rows)
    assert {r["metadata"]["row"] for r in rows} == set(range(6))


@pytest.mark.parametrize("fmt", FORMATS)
async def test_run_batch_api_retry_failed_ends_with_every_item_ok(fmt: str, tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(batch_item_error_rate=0.3, seed=9)) as emu:
        llm = make_llm(emu, fmt)
        out = tmp_path / "out.jsonl"
        items = [BatchItem(f"r{i}", [Message.user(f"q{i}")]) for i in range(30)]
        written = await llm.run_batch_api(
            items, out, poll_interval=0.02, retry_failed=True, max_rounds=20
        )
        await llm.aclose()
        assert emu.stats()["batches"][fmt] > 1  # failures really were resubmitted
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert written == 30 == len(records) == len({r["id"] for r in records})
    # Only invalid_request-style errors (not retryable) may remain.
    assert all(r["ok"] or not r["retryable"] for r in records)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bad", [0, 2, 5], ids=["first", "middle", "last"])
async def test_a_rejected_item_anywhere_leaves_every_other_result_in_its_place(
    emu: Any, fmt: str, bad: int, tmp_path: Path
) -> None:
    """An item whose request cannot be built (an unreadable image) is not uploaded; the items
    around it still get their own answers, each exactly once, and it gets its error."""
    llm = make_llm(emu, fmt, batch_max_requests=4)
    items = make_items(8)
    items[bad] = BatchItem(
        items[bad].id, [Message.user("x", image_urls=[str(tmp_path / "no.png")])]
    )
    out = tmp_path / "out.jsonl"
    assert await llm.run_batch_api(items, out, poll_interval=0.02) == 8
    await llm.aclose()
    records = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert sorted(records) == sorted(i.id for i in items)  # one line each, none twice
    assert records[items[bad].id]["error_kind"] == "invalid_item"
    assert all(r["ok"] for key, r in records.items() if key != items[bad].id)
    assert [records[i.id]["metadata"] for i in items if i.metadata] == [
        {"row": n} for n in range(8) if n != bad
    ]


async def test_run_batch_api_resumes_a_job_whose_creation_was_cut_short(
    emu: Any, tmp_path: Path
) -> None:
    """A crash after 1 of 3 batches was created: the rerun creates the other two, once."""
    llm = make_llm(emu, "openai", batch_max_requests=4)
    items = make_items(12)
    out = tmp_path / "out.jsonl"
    job = await llm.submit_batch(items, spool_dir=tmp_path / "out.jsonl.spool")
    assert len(job.batches) == 3
    job.batches = job.batches[:1]  # as if the process died after the first creation
    job.save(tmp_path / "out.jsonl.job.json")
    assert await llm.run_batch_api(items, out, poll_interval=0.02) == 12
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["id"] for r in records) == sorted(i.id for i in items)
    assert all(r["ok"] for r in records)
    # the first batch plus the 8 missing items as two new batches of at most 4
    assert len(BatchJob.load(tmp_path / "out.jsonl.job.done.json").batches) == 3
    await llm.aclose()


async def test_run_batch_api_again_with_more_items_sends_only_the_new_ones(
    emu: Any, tmp_path: Path
) -> None:
    llm = make_llm(emu, "anthropic")
    out = tmp_path / "out.jsonl"
    assert await llm.run_batch_api(make_items(10), out, poll_interval=0.02) == 10
    before = emu.stats()["batches"]["anthropic"]
    assert await llm.run_batch_api(make_items(16), out, poll_interval=0.02) == 6
    assert emu.stats()["batches"]["anthropic"] == before + 1
    ids = [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()]
    assert sorted(ids) == [f"item-{i:06d}" for i in range(16)]
    await llm.aclose()


def test_an_unreadable_result_line_ends_as_that_items_error_only() -> None:
    from llm_kit.providers.batch_backend import Outcome, decode_lines

    lines = iter([b'{"custom_id": "0"}', b"garbage", b'{"custom_id": "2"}'])
    decoded = list(
        decode_lines(lines, lambda line: Outcome(int(orjson.loads(line)["custom_id"])), "f")
    )
    assert [o.index for o in decoded] == [0, 2]
