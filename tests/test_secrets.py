"""No key is ever written to a file, a result, an error message or a log."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from llm_kit import LLM, BatchConfig, BatchItem, Message
from provider_emulator import EmulatorConfig, Faults, running_emulator

SECRET = "sk-live-DO-NOT-LEAK-7f3a9c"


async def test_no_key_in_any_file_or_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    faults = Faults(rate_500=0.2, rate_insufficient_quota=0.05, retry_after_s=0.01)
    with running_emulator(EmulatorConfig(faults=faults, seed=3)) as emu:
        for fmt, base in (
            ("openai", emu.openai_base_url),
            ("anthropic", emu.anthropic_base_url),
            ("gemini", emu.gemini_base_url),
        ):
            llm = LLM(
                model="m",
                message_format=fmt,
                base_url=base,
                api_key=SECRET,
                config=BatchConfig(retry_base_delay=0.01, max_retries=1),
            )
            items = [BatchItem(f"{fmt}-{i}", [Message.user(f"q{i}")]) for i in range(60)]
            await llm.batch_to_jsonl(items, tmp_path / f"{fmt}.jsonl", progress=True)
            await llm.aclose()
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert b'"ok":false' in written  # errors were recorded, so error texts were scanned too
    assert SECRET.encode() not in written
    out, err = capfd.readouterr()
    assert SECRET not in out + err
    assert SECRET not in caplog.text
