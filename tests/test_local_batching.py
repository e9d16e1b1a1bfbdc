"""Continuous batching in the embedded engine, run for real on SmolLM2-135M-Instruct."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import pytest
from pydantic import BaseModel

pytest.importorskip("llama_cpp")

from llm_kit.errors import ConfigError, ItemError, ProviderError
from llm_kit.local import LocalEngine
from llm_kit.local.scheduler import GAP_WORTH, BatchScheduler
from llm_kit.local.sequence import Request, Sequence
from llm_kit.local.threads import THREADS_ENV, ThreadTuner, choose_threads, usable_cpus


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: float


class City(BaseModel):
    city: str
    country: str
    population: int


# A grammar that cannot close before ~800 tokens: the request runs until cancelled.
ENDLESS = {"type": "array", "items": {"type": "integer"}, "minItems": 400}


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    eng = LocalEngine(slots=4)
    eng.load()
    yield eng
    eng.close()


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def wait_until(condition: Any, what: str) -> None:
    """Poll a condition that the engine's own thread makes true (no timing assertion: the
    limit only stops a broken engine from hanging the suite)."""
    deadline = time.monotonic() + 300
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def submit_together(engine: LocalEngine, calls: list[dict[str, Any]]) -> list[Any]:
    """Run complete_sync calls from threads so that they all start in one batch."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures: list[Future[Any]] = []
        with engine.held():
            for call in calls:
                futures.append(pool.submit(engine.complete_sync, **call))
            wait_until(lambda: engine.queued == len(calls), "every request queued")
        return [future.result() for future in futures]


def test_concurrent_requests_share_one_batch(engine: LocalEngine) -> None:
    prompts = ["Name a fruit.", "Name a city.", "Name an animal.", "Name a planet."]
    before = engine.stats.decode_calls
    results = submit_together(engine, [{"messages": user(p), "max_tokens": 12} for p in prompts])
    assert engine.stats.widest_batch == 4  # one llama_decode call held all four sequences
    assert all(r.text and r.usage.output_tokens > 0 for r in results)
    # Four answers of up to 12 tokens took far fewer than 4 x 12 decode calls: they overlapped.
    assert engine.stats.decode_calls - before <= 13


def test_a_step_lists_its_sequences_in_slot_order_and_reuses_the_graph() -> None:
    # llama.cpp cuts a batch into one graph per run of consecutive sequence ids: requests that
    # come and go in another order must still reach it in slot order.
    four = LocalEngine(slots=4)
    try:
        four.load()
        assert four.stats.graphs_reused == 0  # calibration's decodes are not counted
        model = four._scheduler.model  # type: ignore[union-attr]
        batches: list[list[int]] = []
        fill = model.batch_fill
        model.batch_fill = lambda rows: (batches.append([r[2] for r in rows]), fill(rows))[1]
        lengths = [24, 40, 30, 36, 28, 20, 32, 26]  # steady stretches between joins
        calls = [{"messages": user("Count from 1 to 100."), "max_tokens": n} for n in lengths]
        submit_together(four, calls)
        assert len({tuple(sorted(set(b))) for b in batches}) > 1  # slots came and went
        assert all(b == sorted(b) for b in batches)
        # Most decodes kept the graph of the one before (only joins and leaves change it).
        assert four.stats.graphs_reused > four.stats.decode_calls // 2
    finally:
        four.close()


def best_slot(free: list[int], kept: dict[int, list[int]], prompt: list[int]) -> tuple[int, int]:
    scheduler = BatchScheduler.__new__(BatchScheduler)  # only the slot bookkeeping is used
    scheduler._free, scheduler._kept = free, kept
    return scheduler._best_slot(prompt)


def test_a_request_takes_the_lowest_free_slot_unless_another_keeps_much_more() -> None:
    # Running slots stay consecutive (each gap splits every step into one more graph), unless
    # a higher slot saves at least GAP_WORTH prompt tokens.
    template = list(range(100))
    prompt = template + list(range(1000, 1000 + 200))
    near = template + list(range(1000, 1000 + GAP_WORTH - 1))  # shares 63 tokens more
    far = template + list(range(1000, 1000 + GAP_WORTH))  # shares 64 tokens more
    assert best_slot([3, 1, 2], {1: template, 2: near}, prompt) == (1, 100)
    assert best_slot([3, 1, 2], {1: template, 2: far}, prompt) == (2, 100 + GAP_WORTH)
    # Equals go to the lowest; never the whole prompt (its last token starts the answer).
    assert best_slot([2, 0], {0: prompt, 2: prompt}, prompt) == (0, len(prompt) - 1)


def test_prompt_room_goes_first_to_the_request_that_came_first() -> None:
    # Rows are listed in slot order, but when prompts do not all fit in n_batch, the request
    # that arrived first decodes its prompt first (a late one in a lower slot waits).
    def request(prompt: list[int]) -> Request:
        return Request(prompt, 8, 0.0, None, 0, 1.1, [])

    scheduler = BatchScheduler.__new__(BatchScheduler)  # only the batch bookkeeping is used
    scheduler.model = SimpleNamespace(n_batch=8)
    first, second = Sequence(request([1] * 6), slot=3), Sequence(request([2] * 6), slot=1)
    scheduler._active = {3: first, 1: second}  # arrival order
    rows, sampled = scheduler._batch_rows()
    assert [row[2] for row in rows] == [1, 1, 3, 3, 3, 3, 3, 3]
    assert (first.fed, second.fed) == (6, 2)
    assert sampled == [(7, first)]  # its last prompt token's logits start its answer


def test_repeat_penalty_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="repeat_penalty must be > 0"):
        LocalEngine(repeat_penalty=0)


def test_each_sequence_follows_its_own_schema(engine: LocalEngine) -> None:
    sentiment = Sentiment.model_json_schema()
    city = City.model_json_schema()
    calls = [
        {"messages": user("I love it! Sentiment as JSON."), "json_schema": sentiment},
        {"messages": user("Describe Paris as JSON."), "json_schema": city},
        {"messages": user("The food was awful. Sentiment as JSON."), "json_schema": sentiment},
        {"messages": user("Describe Tokyo as JSON."), "json_schema": city},
    ]
    results = submit_together(engine, [{**c, "max_tokens": 64} for c in calls])
    assert engine.stats.widest_batch >= 4
    Sentiment.model_validate(json.loads(results[0].text))
    City.model_validate(json.loads(results[1].text))
    Sentiment.model_validate(json.loads(results[2].text))
    City.model_validate(json.loads(results[3].text))


def test_sampled_answers_with_a_seed_repeat_in_the_same_batch(engine: LocalEngine) -> None:
    calls = [
        {"messages": user("Write a one-line poem about the sea."), "temperature": 1.0, "seed": 7},
        {"messages": user("Name a number."), "temperature": 1.0, "seed": 3},
    ]
    first = submit_together(engine, [{**c, "max_tokens": 16} for c in calls])
    again = submit_together(engine, [{**c, "max_tokens": 16} for c in calls])
    assert [r.text for r in first] == [r.text for r in again]


async def test_a_cancelled_request_frees_its_slot() -> None:
    # One slot: the request after the cancelled one can only run once that slot is freed.
    single = LocalEngine(slots=1)
    try:
        endless = asyncio.create_task(
            single.complete(user("List numbers."), max_tokens=1500, json_schema=ENDLESS)
        )
        await asyncio.to_thread(wait_until, lambda: single.stats.decode_calls >= 3, "decoding")
        endless.cancel()
        with pytest.raises(asyncio.CancelledError):
            await endless
        after = await single.complete(user("Say hello."), max_tokens=8)
        assert after.text and after.usage.output_tokens > 0
        assert single.stats.cancelled == 1
        assert single.stats.tokens_before_cancel < 1500  # it stopped, it did not run out
        assert single.running == 0
    finally:
        single.close()


def test_a_slot_decodes_only_what_its_kept_prompt_does_not_share() -> None:
    # One slot, requests in turn: every prompt starts with the same chat template and system
    # prompt, which the slot keeps from the request before.
    single = LocalEngine(slots=1)
    try:
        single.complete_sync(user("Name a fruit."), max_tokens=4)
        assert single.stats.prompt_tokens_reused == 0
        city = single.complete_sync(user("Name a city."), max_tokens=4)
        shared = single.stats.prompt_tokens_reused
        assert 0 < shared < city.usage.input_tokens
        # The same prompt again: all of it stays but its last token, whose logits start the
        # answer.
        decoded = single.stats.tokens_decoded
        again = single.complete_sync(user("Name a city."), max_tokens=4)
        assert single.stats.prompt_tokens_reused - shared == again.usage.input_tokens - 1
        assert single.stats.tokens_decoded - decoded == again.usage.output_tokens
    finally:
        single.close()


def test_answers_after_a_reused_prompt_equal_answers_from_a_fresh_slot() -> None:
    prompts = [f"Write two sentences about topic number {i}." for i in range(4)]

    def answers(engines: list[LocalEngine]) -> list[str | None]:
        pairs = zip(engines, prompts, strict=True)
        return [e.complete_sync(user(p), max_tokens=24).text for e, p in pairs]

    fresh_engines = [LocalEngine(slots=1) for _ in prompts]
    try:
        fresh = answers(fresh_engines)
    finally:
        for e in fresh_engines:
            e.close()
    single = LocalEngine(slots=1)
    try:
        reused = answers([single] * len(prompts))
        assert single.stats.prompt_tokens_reused > 0
        schema = Sentiment.model_json_schema()
        json_answer = single.complete_sync(user("I love it! As JSON."), json_schema=schema)
        Sentiment.model_validate(json.loads(json_answer.text or ""))
    finally:
        single.close()
    assert reused == fresh  # temperature 0, one sequence at a time: the same tokens


async def test_a_request_after_a_cancelled_one_reuses_only_what_was_decoded() -> None:
    single = LocalEngine(slots=1)
    try:
        endless = asyncio.create_task(
            single.complete(user("List numbers."), max_tokens=1500, json_schema=ENDLESS)
        )
        await asyncio.to_thread(wait_until, lambda: single.stats.decode_calls >= 3, "decoding")
        endless.cancel()
        with pytest.raises(asyncio.CancelledError):
            await endless
        after = await single.complete(user("List numbers."), max_tokens=8)
        assert after.text and after.usage.output_tokens > 0
        assert single.stats.prompt_tokens_reused == after.usage.input_tokens - 1
    finally:
        single.close()


def test_a_request_cancelled_while_waiting_never_runs() -> None:
    single = LocalEngine(slots=1)
    try:
        with single.held():
            request = single._request(
                user("Say hello."),
                max_tokens=8,
                temperature=None,
                top_p=None,
                seed=None,
                stop=None,
                json_schema=None,
            )
            single._submit(request)
            assert request.future.cancel()
        after = single.complete_sync(user("Say hi."), max_tokens=4)
        assert after.usage.output_tokens > 0
        assert single.stats.requests_done == 1
    finally:
        single.close()


def test_a_bad_request_fails_alone_in_one_sentence(engine: LocalEngine) -> None:
    with ThreadPoolExecutor(2) as pool:
        good = pool.submit(engine.complete_sync, user("Name a colour."), max_tokens=8)
        bad = pool.submit(engine.complete_sync, user("word " * 3000), max_tokens=8)
        with pytest.raises(ItemError) as info:
            bad.result()
        assert good.result().usage.output_tokens > 0
    message = str(info.value)
    assert "context window of 2048" in message
    assert message.count(". ") == 0 and "\n" not in message


def test_closing_fails_waiting_requests_in_one_sentence() -> None:
    single = LocalEngine(slots=1)
    with ThreadPoolExecutor(1) as pool:
        with single.held():
            future = pool.submit(single.complete_sync, user("Say hello."), max_tokens=8)
            wait_until(lambda: single.queued == 1, "queued")
            single.close()
        with pytest.raises(
            ProviderError, match=r"^the local model was closed before this request finished$"
        ):
            future.result()


def test_kv_cache_is_slots_times_context(engine: LocalEngine) -> None:
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x (K and V) x 2 bytes = 23,040 B a token.
    assert engine.kv_cache_bytes() == 4 * 2048 * 23_040


def test_threads_come_from_the_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    choice = choose_threads(None)
    assert choice.candidates[0] == usable_cpus() and choice.candidates[-1] == 1
    assert choice.wait_policy == "default"
    assert choose_threads(3).candidates == (3,)
    monkeypatch.setenv(THREADS_ENV, "1")
    assert choose_threads(3).candidates == (1,)  # the environment wins over the setting
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert choose_threads(None).wait_policy == "passive"
    monkeypatch.setenv(THREADS_ENV, "zero")
    with pytest.raises(ConfigError, match=rf"^{THREADS_ENV} must be a whole number >= 1"):
        choose_threads(None)


def test_loading_logs_the_thread_choice(caplog: pytest.LogCaptureFixture) -> None:
    single = LocalEngine(slots=1, n_threads=1)
    with caplog.at_level(logging.INFO, logger="llm_kit.local"):
        single.load()
    single.close()
    assert "embedded model: 1 thread(s) (fixed) of" in caplog.text
    assert "local_threads" in caplog.text


def run_tuner(tuner: ThreadTuner, step_seconds: dict[int, float], steps: int) -> list[int]:
    """Drive the tuner over decode steps whose time depends only on the thread count."""
    used = []
    for _ in range(steps):
        threads = tuner.pick(measurable=True)
        used.append(threads)
        tuner.record(threads, step_seconds[threads], width=8)
    return used


def test_the_tuner_keeps_the_faster_thread_count_and_checks_again() -> None:
    quiet = ThreadTuner([2, 1])
    run_tuner(quiet, {2: 0.010, 1: 0.016}, steps=20)
    assert quiet.current == 2 and quiet.trials == 1
    # Another process takes a core: two threads wait on each other, steps get 50x slower.
    used = run_tuner(quiet, {2: 0.5, 1: 0.016}, steps=200)
    assert quiet.current == 1
    # Noticed within a few slow steps; from then on two threads get one probing step per
    # trial (dropped at its first slow step, not run three times).
    noticed = ThreadTuner.SLOW_STEPS + 3
    assert used[:noticed].count(1) == 1
    assert used[noticed:].count(2) <= quiet.trials
    loaded = ThreadTuner([2, 1])
    used = run_tuner(loaded, {2: 0.5, 1: 0.016}, steps=300)
    assert loaded.current == 1
    assert used.count(2) <= loaded.trials  # one probing step per trial
    assert loaded.trials < 10  # the interval between trials grows while the choice holds


def test_the_tuner_leaves_a_quiet_machine_alone_at_the_most_threads() -> None:
    # Fewer threads are tried only when steps slow down: on a quiet machine a trial would
    # only spend steps on the slower count.
    quiet = ThreadTuner([2, 1])
    quiet.calibrate(lambda threads: {2: 0.010, 1: 0.016}[threads])
    used = run_tuner(quiet, {2: 0.010, 1: 0.016}, steps=ThreadTuner.MAX_INTERVAL - 10)
    assert quiet.trials == 1 and used.count(1) == 0
    # A step that is slow once (noise) calls no trial; slowing down for good does.
    quiet.record(2, 0.05, width=8)
    run_tuner(quiet, {2: 0.010, 1: 0.016}, steps=5)
    assert quiet.trials == 1
    run_tuner(quiet, {2: 0.018, 1: 0.016}, steps=ThreadTuner.SLOW_STEPS + 6)
    assert quiet.trials == 2 and quiet.current == 1


def test_a_fixed_thread_count_is_never_tuned() -> None:
    fixed = ThreadTuner([3])
    assert set(run_tuner(fixed, {3: 1.0}, steps=50)) == {3}
    assert fixed.trials == 0


LOCAL_CONFIG = """\
processors:
  - type: llm
{processor}
    worker_concurrency: 3
    default_sampling_params: {{temperature: 0, max_new_tokens: 8}}
loading_params:
  state_dir: {dir}/state
  datasets: [{{path: {dir}/rows.jsonl, type: JSONL, output_dir: {dir}/data}}]
  output_format: jsonl
processing_params:
  inputs: [{{name: topic, key: topic}}]
  outputs:
    - {{name: answer, type: llm, output_type: plain, prompt: "Say a word about {{{{ topic }}}}."}}
  remove_columns: true
  output_schema: {{topic: "{{{{ topic }}}}", answer: "{{{{ answer }}}}"}}
execution_params: {{mode: local}}
"""

LOCAL_ONE_THREAD = "    message_format: local\n    local_threads: 1"


def run_mmirage(tmp_path: Path, processor: str, env: dict[str, str] | None = None) -> Any:
    (tmp_path / "rows.jsonl").write_text('{"topic": "cats"}\n{"topic": "rain"}\n')
    config = tmp_path / "config.yaml"
    config.write_text(LOCAL_CONFIG.format(processor=processor, dir=tmp_path))
    mmirage = Path(sys.executable).with_name("mmirage")
    return subprocess.run(
        [str(mmirage), "run", "--log-level", "INFO", str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_mmirage_run_says_which_threads_the_processor_setting_chose(tmp_path: Path) -> None:
    run = run_mmirage(tmp_path, LOCAL_ONE_THREAD, {THREADS_ENV: ""})
    assert run.returncode == 0, run.stderr
    assert "embedded model: 1 thread(s) (fixed)" in run.stderr
    assert "from the processor setting local_threads" in run.stderr
    # worker_concurrency is the number of requests decoded together.
    assert "up to 3 request(s) decoded together, KV cache 135 MiB (3 x 2048 tokens)" in run.stderr


@pytest.mark.slow  # a CPU-model run on 2 threads; the thread report is in the test above
def test_the_environment_variable_overrides_the_processor_setting(tmp_path: Path) -> None:
    run = run_mmirage(tmp_path, LOCAL_ONE_THREAD, {THREADS_ENV: "2"})
    assert run.returncode == 0, run.stderr
    assert f"embedded model: 2 thread(s) (fixed) of {usable_cpus()}" in run.stderr
    assert f"from {THREADS_ENV}" in run.stderr


def test_local_threads_on_another_provider_is_refused(tmp_path: Path) -> None:
    run = run_mmirage(tmp_path, "    base_url: http://127.0.0.1:9/v1\n    local_threads: 1")
    assert run.returncode != 0
    assert "local_threads: is for message_format: local" in run.stderr


def test_worker_concurrency_is_the_number_of_slots_only_when_set() -> None:
    from llm_kit import BatchConfig
    from llm_kit.providers.local import batch_slots

    assert batch_slots(BatchConfig()) is None  # llm_kit's 64 is for HTTP: the engine's 8
    assert batch_slots(BatchConfig(worker_concurrency=5)) == 5


def test_calibration_ignores_the_first_use_of_each_thread_count() -> None:
    first_use = {2: True, 1: True}

    def step(threads: int) -> float:
        # OpenMP starting its threads makes the first 2-thread step slow, not the count itself.
        slow = first_use[threads] and threads == 2
        first_use[threads] = False
        return 1.0 if slow else {2: 0.010, 1: 0.016}[threads]

    tuner = ThreadTuner([2, 1])
    tuner.calibrate(step)
    assert tuner.current == 2 and tuner.trials == 1


def test_calibration_stops_once_one_count_is_left() -> None:
    # Loading the model waits for calibration: a count far slower than the best is tried no
    # more, and the last one left needs no more steps.
    steps: list[int] = []

    def step(threads: int) -> float:
        steps.append(threads)
        return {4: 0.008, 2: 0.010, 1: 0.030}[threads]

    tuner = ThreadTuner([4, 2, 1])
    tuner.calibrate(step)
    assert tuner.current == 4
    # Unmeasured first use of 4 and 2; then 1 is dropped at its second step, and 4 and 2
    # (within GIVE_UP of each other) take turns until only one of them has steps left.
    assert steps == [4, 2, 1, 4, 2, 1, 4, 2, 4]
