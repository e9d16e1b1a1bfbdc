"""`mmirage job status|fetch|cancel|resubmit job.json` as real subprocesses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from llm_kit import LLM, BatchItem, Message
from provider_emulator import EmulatorConfig, running_emulator

KEY = "sk-cli-key-2718"


def mmirage(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def submit(emu: Any, path: Path, n: int) -> None:
    async def work() -> None:
        llm = LLM(model="m", base_url=emu.openai_base_url, api_key=KEY)
        items = [BatchItem(f"c{i}", [Message.user(f"q{i}")]) for i in range(n)]
        job = await llm.submit_batch(items, spool_dir=path.parent / "spool")
        job.save(path)
        await llm.aclose()

    asyncio.run(work())


def test_status_fetch_resubmit(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    out = tmp_path / "out.jsonl"
    with running_emulator(EmulatorConfig(batch_item_error_rate=0.3, seed=4)) as emu:
        submit(emu, job, 20)
        status = mmirage("job", "status", str(job))
        assert status.returncode == 0, status.stderr
        assert "completed" in status.stdout and "20 provider" not in status.stdout
        fetched = mmirage("job", "fetch", str(job), "--output", str(out))
        assert fetched.returncode == 1  # some items failed: the work is not done
        assert "failed" in fetched.stdout
        failed = sum(not orjson.loads(line)["ok"] for line in out.read_bytes().splitlines())
        assert failed > 0
        again = mmirage("job", "resubmit", str(job))
        assert again.returncode == 0 and f"resubmitted {failed} items" in again.stdout
        # The resubmitted items' new results replace their failures: one line per id.
        mmirage("job", "fetch", str(job), "--output", str(out))
        records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
        assert len(records) == len({r["id"] for r in records}) == 20
        assert sum(not r["ok"] for r in records) < failed
    assert KEY not in job.read_text() and KEY not in out.read_text()


def test_fetch_of_a_running_job_needs_wait_and_cancel_works(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    with running_emulator(EmulatorConfig(batch_delay_s=60)) as emu:
        submit(emu, job, 5)
        early = mmirage("job", "fetch", str(job), "-o", str(tmp_path / "o.jsonl"))
        assert early.returncode == 1
        assert "still running" in early.stderr and "Traceback" not in early.stderr
        cancel = mmirage("job", "cancel", str(job))
        assert cancel.returncode == 0, cancel.stderr
        assert "cancel" in cancel.stdout


def test_bad_job_file_is_one_sentence_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "job.json"
    bad.write_text('{"format": "llm_kit.batch_job", "version": 99}')
    result = mmirage("job", "status", str(bad))
    assert result.returncode == 2
    assert "newer llm_kit" in result.stderr and "Traceback" not in result.stderr


def test_missing_key_names_the_variable_not_a_python_argument(tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    with running_emulator(EmulatorConfig()) as emu:
        submit(emu, job, 2)
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
        result = subprocess.run(
            [sys.executable, "-m", "mmirage", "job", "status", str(job)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: no API key for openai: set OPENAI_API_KEY in the environment "
        "(export OPENAI_API_KEY=…)"
    ]
