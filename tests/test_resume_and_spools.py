"""Issue 29, items 6 and 7, over real files and real HTTP to the emulator.

* ``batch_to_jsonl(resume=True)`` decides what to skip from an index on disk, not from a set of
  every finished id: it skips exactly the items the file holds (lines out of order, a torn
  last line, repeated ids, awkward ids), and what it keeps in memory does not grow with the
  file.
* ``submit_batch``'s spool goes once every result has been fetched, except the requests that
  ``resubmit_failed`` may still send (retryable failures), or all of it with ``keep_spool``.
"""

from __future__ import annotations

import random
import socket
import sys
import tracemalloc
from collections import Counter
from pathlib import Path

import orjson
import pytest

from llm_kit import LLM, BatchConfig, BatchItem, BatchJob, BatchResult, Message
from llm_kit import finished_ids as finished_module
from llm_kit import resume_plan as resume_module
from llm_kit.errors import ProviderError
from llm_kit.finished_ids import Finished, FinishedIds
from llm_kit.jsonl import JsonlWriter
from llm_kit.resume_plan import ResumePlan
from provider_emulator import EmulatorConfig, running_emulator

KEY = "sk-resume-spool-test-2718"
AWKWARD = ['quo"te', "back\\slash", "ünïcödé", "tab\there", '","ok":true']


def items_of(ids: list[str]) -> list[BatchItem]:
    return [BatchItem(i, [Message.user(f"question for {i}")]) for i in ids]


def ids_in(path: Path) -> list[str]:
    return [orjson.loads(line)["id"] for line in path.read_bytes().splitlines()]


def write_lines(path: Path, n: int, fail_every: int = 7) -> None:
    """``n`` result lines, quickly (plain writes), every ``fail_every``-th a retryable error."""
    ok = b'","ok":true,"retryable":false,"response":"fine"}\n'
    failed = b'","ok":false,"retryable":true,"error":"HTTP 500"}\n'
    with open(path, "wb") as f:
        f.write(
            b"".join(
                b'{"id":"row-%07d' % i + (failed if i % fail_every == 0 else ok) for i in range(n)
            )
        )


# -- resume ---------------------------------------------------------------------------------


async def test_resume_runs_exactly_the_items_the_file_does_not_hold(tmp_path: Path) -> None:
    ids = [f"row-{i:04d}" for i in range(300)] + AWKWARD
    finished = random.Random(7).sample(ids, 200)  # written in no particular order
    out = tmp_path / "out.jsonl"
    with JsonlWriter(out) as writer:
        for item_id in finished:
            writer.write(BatchResult(item_id, True, response="earlier"))
        writer.write(BatchResult(finished[3], True, response="a repeated id"))
        # A final failure is finished too; a retryable one is, for resume without retry.
        writer.write(BatchResult(finished[5], False, error="refused", retryable=False))
        writer.write(BatchResult(finished[6], False, error="HTTP 500", retryable=True))
    torn = next(i for i in ids if i not in finished)
    with open(out, "ab") as f:  # a crash while writing this item's line
        f.write(orjson.dumps(BatchResult(torn, True, response="cut").to_dict())[:25])
    before = Counter(ids_in_whole_lines(out))

    with running_emulator(EmulatorConfig()) as emu:
        llm = LLM(model="m", base_url=emu.openai_base_url, api_key=KEY)
        written = await llm.batch_to_jsonl(items_of(ids), out, resume=True)
        await llm.aclose()
        requests = emu.stats()["requests"]

    missing = [i for i in ids if i not in set(finished)]
    assert written == requests == len(missing)  # the torn item among them
    assert Counter(ids_in(out)) == before + Counter(missing)


def ids_in_whole_lines(path: Path) -> list[str]:
    return [
        orjson.loads(line)["id"]
        for line in path.read_bytes().splitlines(keepends=True)
        if line.endswith(b"\n")
    ]


async def test_retry_failed_follows_each_ids_last_line(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with JsonlWriter(out) as writer:
        writer.write(BatchResult("a", True, response="first"))
        writer.write(BatchResult("a", False, error="HTTP 500", retryable=True))  # last: retry
        writer.write(BatchResult("b", False, error="HTTP 500", retryable=True))
        writer.write(BatchResult("b", True, response="second"))  # last: done
        writer.write(BatchResult("c", False, error="HTTP 503", retryable=True))
        writer.write(BatchResult("d", False, error="refused", retryable=False))
    with running_emulator(EmulatorConfig()) as emu:
        llm = LLM(model="m", base_url=emu.openai_base_url, api_key=KEY)
        written = await llm.batch_to_jsonl(
            items_of(["a", "b", "c", "d", "e"]), out, retry_failed=True
        )
        await llm.aclose()
        assert written == emu.stats()["requests"] == 3  # a, c and the new e
    records = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    # The retried ids keep their newest line only; b, not retried, keeps both of its own.
    assert Counter(ids_in(out)) == Counter("abbcde")
    assert [records[i]["ok"] for i in "abcde"] == [True, True, True, False, True]


async def test_retry_failed_when_every_line_is_a_retryable_failure(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with JsonlWriter(out) as writer:
        for item_id in "xyz":
            writer.write(BatchResult(item_id, False, error="HTTP 500", retryable=True))
    with running_emulator(EmulatorConfig()) as emu:
        llm = LLM(model="m", base_url=emu.openai_base_url, api_key=KEY)
        assert await llm.batch_to_jsonl(items_of(list("xyz")), out, retry_failed=True) == 3
        await llm.aclose()
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["id"] for r in records) == ["x", "y", "z"] and all(r["ok"] for r in records)


def test_the_index_answers_every_id_by_its_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tiny partitions: the scan spills often and splits partitions, as at 10^8 ids.
    monkeypatch.setattr(finished_module, "_SPILL_EVERY", 500)
    monkeypatch.setattr(finished_module, "_PART_BYTES", 4096)
    out = tmp_path / "out.jsonl"
    write_lines(out, 20_000)
    with JsonlWriter(out) as writer:  # repeats, later lines deciding, and awkward ids
        writer.write(BatchResult("row-0000007", True))  # was a retryable failure
        writer.write(BatchResult("row-0000008", False, error="HTTP 500", retryable=True))
        for item_id in AWKWARD:
            writer.write(BatchResult(item_id, False, error="x", retryable=True))
    with FinishedIds.scan(out) as finished:
        for i in range(0, 20_000, 13):
            want = Finished.RETRYABLE if i % 7 == 0 else Finished.DONE
            assert finished.last_line(f"row-{i:07d}") is want, i
        assert finished.last_line("row-0000007") is Finished.DONE
        assert finished.last_line("row-0000008") is Finished.RETRYABLE
        assert all(finished.last_line(i) is Finished.RETRYABLE for i in AWKWARD)
        assert finished.last_line("row-0020000") is Finished.ABSENT
        assert finished.last_line("row-000001") is Finished.ABSENT  # a prefix of real ids
        assert finished.lines == 20_000 + 2 + len(AWKWARD)
    assert not [p for p in tmp_path.iterdir() if p.name != "out.jsonl"]  # nothing left over


@pytest.mark.parametrize("order", ["as-written", "shuffled", "reversed"])
def test_the_read_ahead_window_never_changes_an_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """The window only saves index reads: items in the file's order or in another, with ids
    the file lacks and file ids never asked for, each item is skipped exactly when it is
    there; in the file's order, the window answers most of them."""
    monkeypatch.setattr(resume_module, "_WIDTH", 16)
    monkeypatch.setattr(resume_module, "_SLIDE", 4)
    out = tmp_path / "out.jsonl"
    in_file = [f"row-{i:04d}" for i in range(0, 600) if i % 5]  # holes: every 5th is missing
    rng = random.Random(3)
    with JsonlWriter(out) as writer:  # nearby lines swapped, as concurrency writes them
        written = in_file[:]
        for n in range(0, len(written) - 1, 3):
            written[n], written[n + 1] = written[n + 1], written[n]
        for item_id in written + AWKWARD:
            writer.write(BatchResult(item_id, True))
    asked = [f"row-{i:04d}" for i in range(700) if not 300 <= i < 350] + AWKWARD
    if order == "shuffled":
        rng.shuffle(asked)
    elif order == "reversed":
        asked.reverse()
    present = set(in_file) | set(AWKWARD)
    lookups = []
    index_lookup = FinishedIds.last_line_of_key
    monkeypatch.setattr(
        FinishedIds,
        "last_line_of_key",
        lambda self, key: lookups.append(key) or index_lookup(self, key),
    )
    with ResumePlan(FinishedIds.scan(out), retry_failed=False) as plan:
        skipped = [i for i in asked if plan.skip(BatchItem(i, [Message.user("q")]))]
    assert skipped == [i for i in asked if i in present]
    if order == "as-written":  # mostly answered by the window, after a gap of unasked ids too
        absent = len(asked) - len(skipped)
        assert len(lookups) < absent + 100, (len(lookups), absent)


def test_what_the_index_keeps_in_memory_does_not_grow_with_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Structural: past the table's cap, the index object is the same size whatever the number
    of ids, holds no container of ids, and the scan's allocations peak at the same height."""
    monkeypatch.setattr(finished_module, "_MAX_BUCKET_BITS", 10)
    monkeypatch.setattr(finished_module, "_PART_BYTES", 64 << 10)
    footprints, peaks = [], []
    for n in (100_000, 400_000):
        out = tmp_path / f"out-{n}.jsonl"
        write_lines(out, n)
        tracemalloc.start()
        with FinishedIds.scan(out) as finished:
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            held = vars(finished).values()
            assert not [v for v in held if isinstance(v, set | frozenset | dict | list)]
            footprints.append(sum(sys.getsizeof(v) for v in held))
            assert finished.last_line(f"row-{n - 1:07d}") is Finished.DONE
        out.unlink()
    assert footprints[0] == footprints[1]
    assert peaks[1] < 1.5 * peaks[0], peaks  # 4x the ids, the same peak


# -- spools ---------------------------------------------------------------------------------


def batch_llm(emu: object, **config: object) -> LLM:
    return LLM(
        model="m",
        message_format="openai",
        base_url=emu.openai_base_url,  # type: ignore[attr-defined]
        api_key=KEY,
        config=BatchConfig(**config),  # type: ignore[arg-type]
    )


def request_positions(spool: Path) -> set[int]:
    return {
        int(orjson.loads(line)["custom_id"])
        for path in spool.rglob("requests-*.jsonl")
        for line in path.read_bytes().splitlines()
    }


async def test_a_complete_fetch_removes_the_spool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_KIT_CACHE_DIR", str(tmp_path / "cache"))
    with running_emulator(EmulatorConfig()) as emu:
        llm = batch_llm(emu, batch_max_requests=4)
        job = await llm.submit_batch(items_of([f"q{i}" for i in range(10)]))
        spool = Path(job.spool_dir or "")
        assert spool.is_relative_to(tmp_path / "cache" / "batches")
        assert len(list(spool.glob("requests-*.jsonl"))) == 3
        await llm.poll_batch(job)
        results = [r async for r in llm.fetch_batch_results(job)]
        await llm.aclose()
    assert len(results) == 10 and all(r.ok for r in results)
    assert not spool.exists()


async def test_a_fetch_stopped_early_or_keep_spool_leaves_it_whole(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        llm = batch_llm(emu)
        job = await llm.submit_batch(items_of(["a", "b", "c"]), spool_dir=tmp_path / "s1")
        await llm.poll_batch(job)
        async for _ in llm.fetch_batch_results(job):
            break  # the caller did not take every result: nothing is removed
        assert request_positions(tmp_path / "s1") == {0, 1, 2}

        kept = await llm.submit_batch(
            items_of(["a", "b"]), spool_dir=tmp_path / "s2", keep_spool=True
        )
        kept.save(tmp_path / "job.json")
        kept = BatchJob.load(tmp_path / "job.json")  # the choice travels with the handle
        assert kept.keep_spool
        await llm.poll_batch(kept)
        assert len([r async for r in llm.fetch_batch_results(kept)]) == 2
        await llm.aclose()
    assert request_positions(tmp_path / "s2") == {0, 1}


async def test_retryable_failures_keep_their_requests_until_resubmitted(tmp_path: Path) -> None:
    """resubmit_failed without items reads the spool: what it needs survives each fetch, the
    rest goes, and once nothing is left to resend the folder goes too."""
    spool = tmp_path / "spool"
    with running_emulator(EmulatorConfig(seed=4, batch_item_error_rate=0.3)) as emu:
        llm = batch_llm(emu, batch_max_requests=10)
        job = await llm.submit_batch(items_of([f"q{i}" for i in range(40)]), spool_dir=spool)
        for _ in range(12):
            await llm.poll_batch(job)
            results = [r async for r in llm.fetch_batch_results(job)]
            positions = {job.item_ids.index(r.id) for r in results if not r.ok and r.retryable}
            if not positions:
                break
            assert request_positions(spool) == positions  # only what a resubmission sends
            assert await llm.resubmit_failed(job) == len(positions)
        await llm.aclose()
    assert all(r.ok or not r.retryable for r in results)
    assert not spool.exists()


async def test_a_submission_that_creates_no_batch_leaves_no_spool(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on: every upload is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    llm = LLM(
        model="m",
        base_url=f"http://127.0.0.1:{port}/v1",
        api_key=KEY,
        config=BatchConfig(max_retries=0),
    )
    with pytest.raises(ProviderError):
        await llm.submit_batch(items_of(["a", "b"]), spool_dir=tmp_path / "s")
    await llm.aclose()
    assert not (tmp_path / "s").exists()
