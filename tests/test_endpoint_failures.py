"""When the endpoint refuses or never answers: real HTTP to the emulator on 127.0.0.1, a closed
port for a dead endpoint, the real ``mmirage`` CLI in subprocesses.

* A sporadic 429 (its rate-limit headers show budget left) backs off only its own request: the
  other workers go on during its backoff, and the pool never pauses. A spent budget still
  pauses every worker.
* With nothing listening at ``base_url`` the pool stops sending after a short streak of
  failed connections: every item left is a retryable ``not_sent`` failure at once, one warning
  names the URL; ``mmirage run`` exits 1 with the rows published as retryable, and
  ``mmirage retry`` computes them once the server answers.
* A 404 on the request path says to check ``base_url``; a 401/403 names the key's variable
  and the host that refused it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_kit import LLM, BatchConfig, BatchItem, BatchResult, ItemQueue, Message
from llm_kit.breaker import CONNECT_STREAK, NOT_SENT
from llm_kit.errors import CompletionError, ProviderError
from provider_emulator import EmulatorConfig, Faults, running_emulator
from provider_emulator.faults import FaultInjector

LONG_WAIT_S = 600.0  # a retry-after no test waits out: only a pause of the whole pool would


def seed_refusing_first(faults: Faults, then_calm: int) -> int:
    """A fault seed whose first request draws a fault and the next ``then_calm`` none (the
    emulator draws once per request, in arrival order)."""
    for seed in range(100_000):
        injector = FaultInjector(faults, seed)
        if injector.draw() is not None and all(injector.draw() is None for _ in range(then_calm)):
            return seed
    raise AssertionError("no such seed")


def items(n: int, start: int = 0) -> list[BatchItem]:
    return [BatchItem(str(i), [Message.user(f"row {i}")]) for i in range(start, start + n)]


def closed_port() -> int:
    """A port nothing listens on (connections to it are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- sporadic 429s -------------------------------------------------------------------------


def test_the_emulator_sporadic_429_shows_budget_left() -> None:
    faults = Faults(rate_429_budget_left=1.0, retry_after_s=2)
    with running_emulator(EmulatorConfig(rpm=1000, faults=faults)) as emu:
        request = urllib.request.Request(
            emu.openai_base_url + "/chat/completions",
            data=json.dumps(
                {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            ).encode(),
            headers={"Authorization": "Bearer sk-test", "Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
    headers = refused.value.headers
    assert refused.value.code == 429 and headers["retry-after"] == "2"
    assert int(headers["x-ratelimit-remaining-requests"]) > 0


def test_a_sporadic_429_backs_off_only_its_own_request() -> None:
    others = 12
    faults = Faults(rate_429_budget_left=0.05, retry_after_s=LONG_WAIT_S)
    seed = seed_refusing_first(faults, then_calm=others)
    config = EmulatorConfig(rpm=1_000_000, faults=faults, seed=seed)  # headers: budget left
    with running_emulator(config) as emu:
        llm = LLM(
            model="m",
            base_url=emu.openai_base_url,
            api_key="sk-test",
            config=BatchConfig(worker_concurrency=4, retry_max_delay=3600),
        )

        async def scenario() -> list[BatchResult]:
            queue, done = ItemQueue(), []
            all_done = asyncio.Event()

            def take(result: BatchResult) -> None:
                done.append(result)
                if len(done) == others:
                    all_done.set()

            pool = asyncio.create_task(llm.batch_to_callback(queue, take))
            queue.put_all(items(1))  # its request is the one refused
            while (await asyncio.to_thread(emu.stats))["status"].get("429", 0) == 0:
                await asyncio.sleep(0.01)
            queue.put_all(items(others, start=1))
            # Paused for the refused request's retry-after, the pool would answer none.
            await asyncio.wait_for(all_done.wait(), timeout=120)
            pool.cancel()
            await asyncio.gather(pool, return_exceptions=True)
            return done

        done = asyncio.run(scenario())
    assert sorted(int(r.id) for r in done) == list(range(1, others + 1))
    assert all(r.ok and r.attempts == 1 for r in done)
    assert llm.request_stats().cooldown_seconds == 0  # nobody waited with it


def test_a_spent_budget_still_pauses_every_worker() -> None:
    # Gemini names the quota it spent (QuotaFailure) in the body of its 429.
    with running_emulator(EmulatorConfig(rpm=1)) as emu:
        llm = LLM(
            model="gemini-2.5-flash",
            message_format="gemini",
            base_url=emu.gemini_base_url,
            api_key="g-test",
            config=BatchConfig(
                worker_concurrency=2, max_retries=1, retry_base_delay=0.1, retry_max_delay=0.2
            ),
        )
        results = asyncio.run(_collect(llm, items(2)))
        assert emu.stats()["status"].get("429", 0) >= 1
    assert sum(r.ok for r in results) == 1
    assert llm.request_stats().cooldown_seconds > 0  # the whole pool waited


def test_a_spent_budget_in_the_headers_pauses_every_worker() -> None:
    # OpenAI's headers: remaining 0 on the 429 of a spent request budget.
    with running_emulator(EmulatorConfig(rpm=1)) as emu:
        llm = LLM(
            model="m",
            base_url=emu.openai_base_url,
            api_key="sk-test",
            config=BatchConfig(worker_concurrency=2, max_retries=0),
        )
        results = asyncio.run(_collect(llm, items(2)))
        assert emu.stats()["status"].get("429", 0) == 1
    assert sum(r.ok for r in results) == 1
    assert llm.request_stats().cooldown_seconds > 0


async def _collect(llm: LLM, batch: list[BatchItem]) -> list[BatchResult]:
    return [r async for r in llm.batch_stream(batch)]


# -- a dead endpoint -------------------------------------------------------------------------


def test_llm_kit_stops_sending_to_a_dead_endpoint_and_a_rerun_sends_what_was_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port, rows, workers = closed_port(), 200, 4
    url = f"http://127.0.0.1:{port}/v1"
    out = tmp_path / "results.jsonl"
    llm = LLM(
        model="m", base_url=url, api_key="sk-test", config=BatchConfig(worker_concurrency=workers)
    )
    with caplog.at_level("WARNING", logger="llm_kit.breaker"):
        asyncio.run(llm.batch_to_jsonl(items(rows), out))
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == rows
    assert all(not r["ok"] and r["retryable"] and r["error_kind"] == NOT_SENT for r in lines)
    assert all(url in r["error"] for r in lines)
    # Before: every row made all its 7 attempts (1,400 here); now a streak, and the workers'
    # attempts under way when it ended.
    assert sum(r["attempts"] for r in lines) <= CONNECT_STREAK + workers
    warnings = [r.getMessage() for r in caplog.records if url in r.getMessage()]
    assert len(warnings) == 1 and "nothing answers at" in warnings[0]

    with running_emulator(EmulatorConfig(), port=port) as emu:
        asyncio.run(llm.batch_to_jsonl(items(rows), out, retry_failed=True))
        assert emu.stats()["requests"] == rows
    newest = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert len(newest) == rows and all(r["ok"] for r in newest.values())


def test_a_pool_of_one_worker_stops_sending_too() -> None:
    # Too few attempts for the streak: at least two failures over CONNECT_WINDOW_S trip it.
    url = f"http://127.0.0.1:{closed_port()}/v1"
    llm = LLM(model="m", base_url=url, api_key="sk-test", config=BatchConfig(worker_concurrency=1))
    results = asyncio.run(_collect(llm, items(20)))
    assert all(not r.ok and r.retryable for r in results)
    assert all(r.error_kind == NOT_SENT for r in results[1:])
    # The first item's own attempts at most (before: 20 items x 7 attempts, minutes of waits).
    assert sum(r.attempts for r in results) <= llm.config.max_retries + 1


def cli(
    *args: str, root: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI; the 30 s of "fails within 30 s" are the bound of its subprocess."""
    environment = {**os.environ, "OPENAI_API_KEY": "sk-endpoint", **(env or {})}
    environment["XDG_CACHE_HOME"] = str(root / "cache")
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=environment,
        cwd=root,
    )


def pipeline(root: Path, base_url: str, rows: int) -> Path:
    data = root / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(rows)))
    config = {
        "processors": [{"type": "llm", "base_url": base_url, "model": "echo"}],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(root / "out")}],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Row {{ id }}"}],
            "output_schema": {"row": "{{ id }}", "answer": "{{ answer }}"},
        },
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def published(root: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (root / "out/shard-0-of-1.jsonl").read_text().splitlines()]


def test_mmirage_fails_fast_on_a_dead_endpoint_and_retry_sends_the_rows(tmp_path: Path) -> None:
    port, rows = closed_port(), 300
    url = f"http://127.0.0.1:{port}/v1"
    config = pipeline(tmp_path, url, rows)
    ran = cli("run", str(config), root=tmp_path)  # before: still going after 300 s
    assert ran.returncode == 1, ran.stderr
    assert ran.stderr.count(f"nothing answers at {url}:") == 1  # the warning, once
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("error:") and url in last and "'mmirage retry CONFIG'" in last
    out = published(tmp_path)
    assert len(out) == rows
    assert all("not sent" in row["__errors__"]["answer"] and "__retry__" in row for row in out)

    with running_emulator(EmulatorConfig(), port=port) as emu:
        retried = cli("retry", str(config), root=tmp_path)
        assert retried.returncode == 0, retried.stderr
        assert emu.stats()["requests"] == rows
    assert all(row["__errors__"] is None and row["answer"] for row in published(tmp_path))


# -- refusals with something to do ---------------------------------------------------------


def test_a_404_on_the_request_path_says_to_check_base_url(emulator: Any) -> None:
    llm = LLM(model="m", base_url=emulator.url, api_key="sk-test")  # no /v1
    with pytest.raises(CompletionError) as failed:
        asyncio.run(llm.complete("hi"))
    message = str(failed.value)
    assert "HTTP 404" in message
    assert f"nothing at {emulator.url}/chat/completions" in message
    assert "check base_url (most servers want it to end in /v1)" in message


def test_a_401_names_the_key_variable_and_the_host(emulator: Any) -> None:
    llm = LLM(model="m", base_url=emulator.openai_base_url)  # no key sent
    with pytest.raises(ProviderError) as refused:
        asyncio.run(llm.complete("hi"))
    host = f"127.0.0.1:{emulator.port}"
    assert refused.value.status == 401
    assert f"the API key was rejected by {host}: none was sent: set OPENAI_API_KEY" in str(
        refused.value
    )


def test_a_403_names_the_key_variable_too(emulator: Any) -> None:
    # The emulator's Gemini answers a request without a key 403 PERMISSION_DENIED, as Google.
    llm = LLM(model="gemini-2.5-flash", message_format="gemini", base_url=emulator.gemini_base_url)
    with pytest.raises(ProviderError) as refused:
        asyncio.run(llm.complete("hi"))
    assert refused.value.status == 403
    assert "GEMINI_API_KEY" in str(refused.value) and f"127.0.0.1:{emulator.port}" in str(
        refused.value
    )


def test_mmirage_stops_on_a_rejected_key_naming_the_variable(tmp_path: Path, emulator: Any) -> None:
    config = pipeline(tmp_path, emulator.openai_base_url, rows=3)
    ran = cli("run", str(config), root=tmp_path, env={"OPENAI_API_KEY": ""})
    assert ran.returncode == 1
    assert f"the API key was rejected by 127.0.0.1:{emulator.port}" in ran.stderr
    assert "OPENAI_API_KEY" in ran.stderr
