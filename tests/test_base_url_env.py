"""``<PROVIDER>_BASE_URL`` moves a provider's home URL, as the official SDKs' variables do.

A live ``LLM`` and a ``batch_api`` processor given no ``base_url`` reach the emulator that the
variable names; an explicit ``base_url`` still wins over the variable.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TEST_KEY
from llm_kit import LLM, Message
from llm_kit.providers import provider_spec

MMIRAGE = Path(sys.executable).with_name("mmirage")


def test_the_variable_names_the_provider() -> None:
    assert provider_spec("openai").base_url_env == "OPENAI_BASE_URL"
    assert provider_spec("anthropic").base_url_env == "ANTHROPIC_BASE_URL"
    assert provider_spec("gemini").base_url_env == "GEMINI_BASE_URL"
    assert provider_spec("local").base_url_env is None


def test_unset_means_the_providers_home(monkeypatch: pytest.MonkeyPatch) -> None:
    assert provider_spec("openai").default_base_url == "https://api.openai.com/v1"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    assert provider_spec("openai").default_base_url == "http://127.0.0.1:9/v1"


def test_live_llm_follows_the_variable(monkeypatch: pytest.MonkeyPatch, emulator: object) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", emulator.openai_base_url)  # type: ignore[attr-defined]
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    llm = LLM(model="gpt-4o-mini", message_format="openai")

    async def ask() -> str:
        async with llm:
            return await llm.complete([Message.user("ping")])

    assert "ping" in asyncio.run(ask())
    assert LLM(model="m", message_format="openai", base_url="http://x/v1").base_url == "http://x/v1"


def test_batch_api_processor_follows_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emulator: object
) -> None:
    (tmp_path / "rows.jsonl").write_text('{"q": "ping"}\n')
    (tmp_path / "c.yaml").write_text(
        "processors:\n  - {type: batch_api, provider: anthropic, model: claude-x}\n"
        f"loading_params:\n  state_dir: {tmp_path}/state\n"
        f"  datasets: [{{path: {tmp_path}/rows.jsonl, type: JSONL, output_dir: {tmp_path}/out}}]\n"
        "processing_params:\n  inputs: [{name: q, key: q}]\n"
        "  outputs: [{name: a, type: batch_api, output_type: plain, prompt: '{{ q }}'}]\n"
        "  output_schema: {q: '{{ q }}', a: '{{ a }}'}\n"
    )
    env = {"ANTHROPIC_BASE_URL": emulator.url, "ANTHROPIC_API_KEY": TEST_KEY}  # type: ignore[attr-defined]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    run = subprocess.run(
        [str(MMIRAGE), "run", "--config", str(tmp_path / "c.yaml")], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    receipts = [
        json.loads(line)
        for path in tmp_path.rglob("*.jsonl")
        for line in path.read_text().splitlines()
        if "provider_batch_id" in line
    ]
    assert receipts and all(r["provider_batch_id"] for r in receipts), run.stderr
