"""A batch submission stopped mid-way never pays twice, and lost receipts are rebuilt.

2,000 rows in 40 chunks of 50 go to an emulator (in its own process) whose batch creations
answer 0.5 s after the batch exists: a stop at that moment leaves a batch the client never
heard of. ``mmirage run`` is stopped by SIGINT, SIGTERM or SIGKILL at two moments of the
submission, then run to completion; the provider must then hold every custom_id exactly once
(read back through the providers' own list and result endpoints). The same for ``mmirage
retry`` resubmitting the requests of canceled batches: every request succeeds exactly once.
The same for llm_kit's ``run_batch_api``. A receipt that cannot be written (ENOSPC) is printed
on stderr and the rerun adopts its batch; a truncated receipt file loses no row for check and
merge.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from batch_spec_support import MMIRAGE, batches_created, cli_env, mmirage, write_rows, write_yaml
from llm_kit.providers import get_codec, provider_spec
from llm_kit.providers.batch_backend import BatchBackend
from llm_kit.transport import HttpTransport
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle

KEY = "sk-interrupt-test-2718"
KEY_VAR = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}
PROVIDERS = tuple(KEY_VAR)
ROWS, PER_CHUNK = 2000, 50  # 40 chunks
STOP_AFTER = (3, 17)  # batches the provider holds when each stop is sent
CREATE_DELAY_S = 0.5

T = TypeVar("T")


def providers_and(signals: list[signal.Signals]) -> list[Any]:
    """Every provider with every signal, ids ``provider-SIGNAME``. `make test` keeps a diagonal
    (each provider once, each signal once: a minute of the suite); the rest are marked slow."""
    return [
        pytest.param(
            provider,
            sig,
            id=f"{provider}-{sig.name}",
            marks=() if j == i % len(signals) else pytest.mark.slow,
        )
        for i, provider in enumerate(PROVIDERS)
        for j, sig in enumerate(signals)
    ]


@pytest.fixture
def slow_emulator() -> Iterator[EmulatorHandle]:
    config = EmulatorConfig(seed=11, batch_create_delay_s=CREATE_DELAY_S)
    with running_emulator(config, subprocess=True) as emu:
        yield emu


def base_url(emu: EmulatorHandle, provider: str) -> str:
    return emu.openai_base_url if provider == "openai" else emu.url


def env_for(provider: str, **extra: str) -> dict[str, str]:
    # The worktree's sources, not the installed ones, in the CLI subprocess.
    return cli_env(**{KEY_VAR[provider]: KEY}, PYTHONPATH=os.environ.get("PYTHONPATH", ""), **extra)


def pipeline(root: Path, emu: EmulatorHandle, provider: str, rows: int = ROWS) -> Path:
    data = {
        "processors": [
            {
                "type": "batch_api",
                "provider": provider,
                "model": MODEL[provider],
                "base_url": base_url(emu, provider),
                "metadata_output_path": str(root / "meta" / "batch_metadata.jsonl"),
                "max_requests_per_chunk": PER_CHUNK,
            }
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [
                {
                    "path": write_rows(root / "data.jsonl", [{"q": f"q{i}"} for i in range(rows)]),
                    "type": "JSONL",
                    "output_dir": str(root / "out"),
                }
            ],
            "output_format": "jsonl",
            "batch_size": 100,
        },
        "processing_params": {
            "inputs": [{"name": "q", "key": "q"}],
            "outputs": [{"name": "answer", "type": "batch_api", "prompt": "Say {{ q }}"}],
            "output_schema": {"q": "{{ q }}", "answer": "{{ answer }}"},
        },
    }
    return write_yaml(root / "config.yaml", data)


def with_backend(
    emu: EmulatorHandle, provider: str, work: Callable[[BatchBackend], Awaitable[T]]
) -> T:
    """``work`` on the provider's batch backend, as a client with the test key sees it."""

    async def run() -> T:
        codec = get_codec(provider)
        http = HttpTransport(
            base_url(emu, provider),
            codec.auth_headers(KEY),
            max_connections=4,
            request_timeout=60,
            connect_timeout=10,
        )
        backend_cls = provider_spec(provider).batch_backend
        assert backend_cls is not None
        try:
            return await work(backend_cls(codec, http, MODEL[provider]))
        finally:
            await http.aclose()

    return asyncio.run(run())


def held_custom_ids(
    emu: EmulatorHandle, provider: str, *, succeeded_only: bool = False
) -> Counter[str]:
    """How many times the provider holds each custom_id (or returned it as a success), over
    every batch it lists."""

    async def read(backend: BatchBackend) -> Counter[str]:
        held: Counter[str] = Counter()
        with tempfile.TemporaryDirectory() as tmp:
            async for batch, _ in backend.listed(0.0):
                await backend.refresh(batch)
                async for outcome in backend.results(batch, Path(tmp)):
                    if not succeeded_only or outcome.error is None:
                        held[outcome.custom_id] += 1
        return held

    return with_backend(emu, provider, read)


def stop_when_held(
    proc: subprocess.Popen[bytes], emu: EmulatorHandle, provider: str, count: int, sig: int
) -> None:
    """Send ``sig`` as soon as the provider holds ``count`` batches (a creation's answer is
    then on its way), and wait for the process to end."""
    deadline = time.monotonic() + 120
    while batches_created(emu, provider) < count and proc.poll() is None:
        assert time.monotonic() < deadline, "the submission never got that far"
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(sig)
    proc.wait(timeout=200)


@pytest.mark.parametrize(
    ("provider", "sig"), providers_and([signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
)
def test_a_stopped_submission_then_a_rerun_holds_every_request_once(
    provider: str, sig: int, slow_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    config = pipeline(tmp_path, slow_emulator, provider)
    env = env_for(provider)
    for count in STOP_AFTER:
        with open(tmp_path / "stopped.err", "wb") as err:
            proc = subprocess.Popen([MMIRAGE, "run", str(config)], env=env, stderr=err)
            stop_when_held(proc, slow_emulator, provider, count, sig)
    done = mmirage("run", config, env=env, timeout=300)
    assert done.code == 0, done
    held = held_custom_ids(slow_emulator, provider)
    twice = sorted(cid for cid, n in held.items() if n > 1)
    assert not twice, f"{len(twice)} requests billed twice, e.g. {twice[:3]}"
    assert set(held) == {f"answer-text-{i}" for i in range(ROWS)}
    checked = mmirage("check", config, env=env)
    assert checked.code == 0, checked


# -- a receipt that cannot be written ------------------------------------------------------


def no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "receipt")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_receipt_lost_to_a_full_disk_is_printed_and_its_batch_adopted(
    provider: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mmirage.config import load_mmirage_config
    from mmirage.core.process.batch import intents
    from mmirage.core.shard import run_shard

    with running_emulator(EmulatorConfig(seed=12)) as emu:
        config = load_mmirage_config(pipeline(tmp_path, emu, provider, rows=200))
        monkeypatch.setenv(KEY_VAR[provider], KEY)
        with monkeypatch.context() as disk:  # the .done marker and the receipt line both fail
            disk.setattr(intents, "_write_whole", no_space)
            disk.setattr(intents, "append_receipt", no_space)
            with pytest.raises(RuntimeError, match="rerun"):
                run_shard(config, 0)
        err = capfd.readouterr().err
        printed = err.count("was created but its receipt could not be written")
        assert printed == batches_created(emu, provider) >= 1
        assert "No space left on device" in err and KEY not in err
        run_shard(config, 0)
        adopted = [r for r in caplog.records if "adopted" in r.getMessage()]
        assert len(adopted) == printed
        held = held_custom_ids(emu, provider)
    assert max(held.values()) == 1
    assert set(held) == {f"answer-text-{i}" for i in range(200)}


# -- mmirage retry ---------------------------------------------------------------------------

RETRY_ROWS = 500  # 10 chunks of 50
RETRY_STOP_AFTER = (2, 6)  # batches the retries have created when each stop is sent
BATCH_DELAY_S = 10.0  # the run's batches are canceled well before they would end


def ended(emu: EmulatorHandle, provider: str) -> bool:
    async def all_ended(backend: BatchBackend) -> bool:
        return all([batch.state.is_terminal async for batch, _ in backend.listed(0.0)])

    return with_backend(emu, provider, all_ended)


def wait_until_ended(emu: EmulatorHandle, provider: str) -> None:
    deadline = time.monotonic() + 120
    while not ended(emu, provider):
        assert time.monotonic() < deadline, "the batches never ended"
        time.sleep(0.2)


def cancel_every_batch(emu: EmulatorHandle, provider: str) -> None:
    async def cancel(backend: BatchBackend) -> None:
        async for batch, _ in backend.listed(0.0):
            if not batch.state.is_terminal:
                await backend.cancel(batch)

    with_backend(emu, provider, cancel)
    wait_until_ended(emu, provider)


@pytest.mark.parametrize(
    ("provider", "sig"), providers_and([signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
)
def test_a_stopped_retry_then_another_resubmits_every_request_once(
    provider: str, sig: int, tmp_path: Path
) -> None:
    slow = EmulatorConfig(seed=13, batch_create_delay_s=CREATE_DELAY_S, batch_delay_s=BATCH_DELAY_S)
    with running_emulator(slow, subprocess=True) as emu:
        config = pipeline(tmp_path, emu, provider, rows=RETRY_ROWS)
        env = env_for(provider)
        assert mmirage("run", config, env=env).code == 0
        cancel_every_batch(emu, provider)  # the requests not yet done are retry's to resubmit
        done_before = held_custom_ids(emu, provider, succeeded_only=True)
        created = batches_created(emu, provider)
        for count in RETRY_STOP_AFTER:
            with open(tmp_path / "stopped.err", "wb") as err:
                argv = [MMIRAGE, "retry", str(config)]
                proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
                stop_when_held(proc, emu, provider, created + count, sig)
        retried = mmirage("retry", config, env=env, timeout=300)
        assert retried.code == 0, retried
        wait_until_ended(emu, provider)
        succeeded = held_custom_ids(emu, provider, succeeded_only=True)
        merged = mmirage("merge", config, "--output-path", tmp_path / "merged.jsonl", env=env)
    assert len(done_before) < RETRY_ROWS  # the retries had requests to resubmit
    twice = sorted(cid for cid, n in succeeded.items() if n > 1)
    assert not twice, f"{len(twice)} requests billed twice, e.g. {twice[:3]}"
    assert set(succeeded) == {f"answer-text-{i}" for i in range(RETRY_ROWS)}
    assert merged.code == 0, merged


def test_a_retry_receipt_lost_to_a_full_disk_is_printed_and_its_batch_adopted(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mmirage.config import load_mmirage_config
    from mmirage.core.process.batch import intents
    from mmirage.core.process.batch.resubmit import retry_failed
    from mmirage.core.shard import run_shard
    from mmirage.rundir import RunDir

    with running_emulator(EmulatorConfig(seed=14, batch_delay_s=BATCH_DELAY_S)) as emu:
        config = load_mmirage_config(pipeline(tmp_path, emu, "openai", rows=200))
        monkeypatch.setenv(KEY_VAR["openai"], KEY)
        run_shard(config, 0)
        cancel_every_batch(emu, "openai")
        created = batches_created(emu, "openai")
        with monkeypatch.context() as disk:  # the .done marker and the receipt line both fail
            disk.setattr(intents, "_write_whole", no_space)
            disk.setattr(intents, "append_receipt", no_space)
            with pytest.raises(OSError):
                retry_failed(config, RunDir.of(config))
        err = capfd.readouterr().err
        assert err.count("was created but its receipt could not be written") == 1
        assert batches_created(emu, "openai") == created + 1 and KEY not in err
        report = retry_failed(config, RunDir.of(config))
        adopted = [r for r in caplog.records if "adopted" in r.getMessage()]
        assert len(adopted) == 1
        assert len(report.new_batches) == batches_created(emu, "openai") - created - 1
        wait_until_ended(emu, "openai")
        succeeded = held_custom_ids(emu, "openai", succeeded_only=True)
    assert max(succeeded.values()) == 1
    assert set(succeeded) == {f"answer-text-{i}" for i in range(200)}


# -- llm_kit's run_batch_api ----------------------------------------------------------------

SCRIPT = textwrap.dedent("""
    import asyncio, sys
    from llm_kit import LLM, BatchConfig, BatchItem, Message

    async def main(fmt, base_url, out):
        llm = LLM(model="m", message_format=fmt, base_url=base_url, api_key=sys.argv[4],
                  max_tokens=8, config=BatchConfig(batch_max_requests=50))
        items = [BatchItem(f"item-{i}", [Message.user(f"q{i}")]) for i in range(2000)]
        await llm.run_batch_api(items, out, poll_interval=0.05)
        await llm.aclose()

    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
""")


@pytest.mark.parametrize(("provider", "sig"), providers_and([signal.SIGINT, signal.SIGKILL]))
def test_run_batch_api_stopped_then_rerun_holds_every_item_once(
    provider: str, sig: int, slow_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    url = slow_emulator.openai_base_url if provider == "openai" else slow_emulator.url
    out = tmp_path / "out.jsonl"
    argv = [sys.executable, "-c", SCRIPT, provider, url, str(out), KEY]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    for count in STOP_AFTER:
        proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
        stop_when_held(proc, slow_emulator, provider, count, sig)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    held = held_custom_ids(slow_emulator, provider)
    twice = sorted(cid for cid, n in held.items() if n > 1)
    assert not twice, f"{len(twice)} items billed twice, e.g. {twice[:3]}"
    assert set(held) == {str(i) for i in range(2000)}
    lines = out.read_text().splitlines()
    assert len(lines) == 2000


# -- a damaged receipt file ------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["truncated", "torn"])
def test_a_damaged_receipt_file_is_rebuilt_from_the_chunk_markers(
    damage: str, emulator: EmulatorHandle, tmp_path: Path
) -> None:
    config = pipeline(tmp_path, emulator, "openai", rows=1000)
    env = env_for("openai")
    assert mmirage("run", config, env=env).code == 0
    (receipts,) = (tmp_path / "meta").glob("batch_metadata.text.*.jsonl")
    data = receipts.read_bytes()
    assert data.count(b"\n") == 20
    if damage == "truncated":  # half a line left of 20
        receipts.write_bytes(data[: data.index(b"\n") // 2])
    else:  # every line but the first torn in the middle
        lines = data.splitlines(keepends=True)
        receipts.write_bytes(
            lines[0] + b"".join(line[: len(line) // 2] + b"\n" for line in lines[1:])
        )
    checked = mmirage("check", config, env=env)
    assert checked.code == 0, checked
    assert "completed: 20/20" in checked.out, checked.out
    merged = tmp_path / "merged.jsonl"
    done = mmirage("merge", config, "--output-path", merged, env=env)
    assert done.code == 0, done
    rows = [orjson.loads(line) for line in merged.read_bytes().splitlines()]
    assert len(rows) == 1000
    assert all(row["answer"] and not row.get("__errors__") for row in rows)
