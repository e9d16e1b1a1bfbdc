"""One key per endpoint (issue 26, item 5): real HTTP to emulators on 127.0.0.1 that accept one
key each, the real ``mmirage`` CLI in subprocesses, real files under ``tmp_path``.

* Two ``llm`` processors in one pipeline, each with its own ``api_key_env``: each endpoint
  receives only its own key (an emulator answers any other key 401, and counts it), and no
  key is written to any file the run leaves.
* A variable named by ``api_key_env`` that is not set: one sentence naming the processor, the
  field and the variable, before anything is sent.
* Error texts name the server that answered (the host of ``base_url``), not "openai".
* A 401, and a gateway's answer about the key (LiteLLM: HTTP 500 in plain text without a key,
  HTTP 400 "No connected db." with a wrong one), are not retried (one request at the
  emulator) and say to check the key for that host, naming the variable.
* The provider's own key sent to another host is said once, naming the variable and the host.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_kit import LLM, BatchConfig, BatchItem, Message
from llm_kit.errors import CompletionError, MissingAPIKeyError, ProviderError
from provider_emulator import EmulatorConfig, Faults, running_emulator
from test_troubleshooting import PAGE as TROUBLESHOOTING
from test_troubleshooting import assert_printed

KEY_A = "sk-gateway-a-0123456789abcdef"
KEY_B = "sk-gateway-b-fedcba9876543210"
OPENAI_KEY = "sk-proj-the-real-openai-key-never-sent-01234"
ROWS = 4


def cli(*args: str, root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The CLI with exactly the keys of ``env`` (none of the caller's)."""
    environment = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    environment.update(env, XDG_CACHE_HOME=str(root / "cache"))
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
        cwd=root,
    )


def two_gateway_pipeline(root: Path, url_a: str, url_b: str, **extra: Any) -> Path:
    data = root / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(ROWS)))
    processors = [
        {"type": "llm", "name": "gw_a", "base_url": url_a, "model": "m", "api_key_env": "GW_A_KEY"},
        {"type": "llm", "name": "gw_b", "base_url": url_b, "model": "m", "api_key_env": "GW_B_KEY"},
    ]
    for processor in processors:
        processor.update(extra)
    config = {
        "processors": processors,
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(root / "out")}],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}],
            "outputs": [
                {"name": "a", "type": "llm", "processor": "gw_a", "prompt": "A {{ id }}"},
                {"name": "b", "type": "llm", "processor": "gw_b", "prompt": "B {{ id }}"},
            ],
            "output_schema": {"row": "{{ id }}", "a": "{{ a }}", "b": "{{ b }}"},
        },
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def files_holding(root: Path, *secrets: str) -> list[str]:
    """The files under ``root`` whose bytes hold any of ``secrets``."""
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            if any(secret.encode() in data for secret in secrets):
                found.append(str(path.relative_to(root)))
    return found


# -- two endpoints, two keys ---------------------------------------------------------------


def test_two_processors_each_send_only_their_own_key(tmp_path: Path) -> None:
    with (
        running_emulator(EmulatorConfig(api_key=KEY_A)) as emu_a,
        running_emulator(EmulatorConfig(api_key=KEY_B)) as emu_b,
    ):
        config = two_gateway_pipeline(tmp_path, emu_a.openai_base_url, emu_b.openai_base_url)
        env = {"GW_A_KEY": KEY_A, "GW_B_KEY": KEY_B, "OPENAI_API_KEY": OPENAI_KEY}
        ran = cli("run", str(config), root=tmp_path, env=env)
        assert ran.returncode == 0, ran.stderr
        # Any other key (B's, or OPENAI_API_KEY) would have been answered 401.
        assert emu_a.stats()["status"] == {"200": ROWS}
        assert emu_b.stats()["status"] == {"200": ROWS}
    rows = [
        json.loads(line) for line in (tmp_path / "out/shard-0-of-1.jsonl").read_text().splitlines()
    ]
    assert len(rows) == ROWS and all(row["a"] and row["b"] for row in rows)
    assert files_holding(tmp_path, KEY_A, KEY_B, OPENAI_KEY) == []
    assert not {KEY_A, KEY_B, OPENAI_KEY} & {*ran.stdout.split(), *ran.stderr.split()}


def test_a_variable_named_by_api_key_env_that_is_unset_is_one_sentence(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(api_key=KEY_A)) as emu:
        config = two_gateway_pipeline(tmp_path, emu.openai_base_url, emu.openai_base_url)
        ran = cli("run", str(config), root=tmp_path, env={"GW_A_KEY": KEY_A})
        assert emu.stats()["requests"] == 0  # refused before anything was sent
    assert ran.returncode == 2, ran.stderr
    message = ran.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "processor 'gw_b'" in message and "api_key_env" in message and "GW_B_KEY" in message
    assert "export GW_B_KEY=" in message
    # docs/troubleshooting.md quotes the sentence as printed.
    quote = (
        "processor '<name>': api_key_env: <VARIABLE> is not set in the environment; "
        "run `export <VARIABLE>=…` with the key for <host>."
    )
    assert quote in TROUBLESHOOTING.read_text(encoding="utf-8")
    assert_printed(quote, message, "error: ")


def test_a_key_written_where_its_variable_belongs_is_refused_unquoted(tmp_path: Path) -> None:
    config = two_gateway_pipeline(tmp_path, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1")
    config.write_text(config.read_text().replace("GW_A_KEY", OPENAI_KEY))
    ran = cli("check", str(config), root=tmp_path, env={})
    assert ran.returncode == 2, ran.stderr
    assert "processors[0].api_key_env" in ran.stderr and "not the key" in ran.stderr
    assert OPENAI_KEY not in ran.stderr + ran.stdout


def test_llm_kit_reads_the_key_from_the_variable_it_is_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GW_A_KEY", KEY_A)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    with running_emulator(EmulatorConfig(api_key=KEY_A)) as emu:
        llm = LLM(model="m", base_url=emu.openai_base_url, api_key_env="GW_A_KEY")
        assert asyncio.run(llm.complete("hi"))
        assert emu.stats()["status"] == {"200": 1}
    assert KEY_A not in repr(vars(llm))  # kept in memory, shown nowhere
    monkeypatch.delenv("GW_A_KEY")
    with pytest.raises(MissingAPIKeyError, match="GW_A_KEY"):
        LLM(model="m", base_url="http://127.0.0.1:9/v1", api_key_env="GW_A_KEY")


# -- which server answered -------------------------------------------------------------------


def test_an_error_names_the_host_that_answered_not_openai() -> None:
    with running_emulator(EmulatorConfig(faults=Faults(rate_500=1.0))) as emu:
        llm = LLM(
            model="m",
            base_url=emu.openai_base_url,
            api_key=KEY_A,
            config=BatchConfig(max_retries=0),
        )
        with pytest.raises(CompletionError) as failed:
            asyncio.run(llm.complete("hi"))
    message = str(failed.value)
    assert message.startswith(f"127.0.0.1:{emu.port} answered HTTP 500"), message
    assert "openai" not in message


# -- refusals of the key are not retried ---------------------------------------------------


def one_worker_llm(url: str, variable: str) -> LLM:
    config = BatchConfig(worker_concurrency=1, max_retries=6, on_failure="record")
    return LLM(model="m", base_url=url, api_key_env=variable, config=config)


async def run_items(llm: LLM, count: int) -> None:
    items = [BatchItem(str(i), [Message.user(f"row {i}")]) for i in range(count)]
    async for _ in llm.batch_stream(items):
        pass


@pytest.mark.parametrize(
    ("refuse_keys_as", "status"),
    [("provider", 401), ("litellm", 400)],
    ids=["openai-401", "litellm-no-connected-db"],
)
def test_a_wrong_key_is_not_retried_and_names_variable_and_host(
    monkeypatch: pytest.MonkeyPatch, refuse_keys_as: str, status: int
) -> None:
    monkeypatch.setenv("GW_A_KEY", "sk-wrong-key-0123456789abcdef")
    emulator = EmulatorConfig(api_key=KEY_A, refuse_keys_as=refuse_keys_as)  # type: ignore[arg-type]
    with running_emulator(emulator) as emu:
        with pytest.raises(ProviderError) as refused:
            asyncio.run(run_items(one_worker_llm(emu.openai_base_url, "GW_A_KEY"), 5))
        assert emu.stats()["requests"] == 1  # before: 7 (the first try and 6 retries)
    message = str(refused.value)
    assert refused.value.status == status and not refused.value.retryable
    assert message.startswith(f"127.0.0.1:{emu.port} answered HTTP {status}"), message
    assert f"the API key was rejected by 127.0.0.1:{emu.port}: check GW_A_KEY" in message
    assert "sk-wrong-key-0123456789abcdef" not in message


def test_a_gateway_500_about_a_missing_key_is_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GW_A_KEY", KEY_A)
    emulator = EmulatorConfig(api_key=KEY_A, refuse_keys_as="litellm")
    with running_emulator(emulator) as emu:
        llm = LLM(model="m", base_url=emu.openai_base_url, config=BatchConfig(max_retries=6))
        with pytest.raises(ProviderError) as refused:  # no key sent at all
            asyncio.run(llm.complete("hi"))
        assert emu.stats()["requests"] == 1  # before: 7
    message = str(refused.value)
    assert refused.value.status == 500 and not refused.value.retryable
    assert f"the API key was rejected by 127.0.0.1:{emu.port}: none was sent" in message


def test_mmirage_stops_at_a_gateway_refusing_the_key_naming_the_variable(tmp_path: Path) -> None:
    emulator = EmulatorConfig(api_key=KEY_A, refuse_keys_as="litellm")
    with running_emulator(emulator) as emu_a, running_emulator(EmulatorConfig()) as emu_b:
        config = two_gateway_pipeline(
            tmp_path, emu_a.openai_base_url, emu_b.openai_base_url, worker_concurrency=1
        )
        env = {"GW_A_KEY": "sk-wrong-key-0123456789abcdef", "GW_B_KEY": KEY_B}
        ran = cli("run", str(config), root=tmp_path, env=env)
        assert emu_a.stats()["requests"] == 1  # not retried
        assert ran.returncode == 1, ran.stderr
        assert f"the API key was rejected by 127.0.0.1:{emu_a.port}: check GW_A_KEY" in ran.stderr
        paid_at_b = emu_b.stats()["status"].get("200", 0)
        # With the right key, the run completes; what B answered before is not bought again.
        rerun = cli("run", str(config), root=tmp_path, env={**env, "GW_A_KEY": KEY_A})
        assert rerun.returncode == 0, rerun.stderr
        assert emu_b.stats()["status"].get("200", 0) == ROWS >= paid_at_b
    rows = [
        json.loads(line)
        for line in (tmp_path / "out/shard-0-of-1.jsonl").read_text().split("\n")
        if line
    ]
    assert len(rows) == ROWS and all(row["a"] and row["b"] for row in rows)
    assert files_holding(tmp_path, "sk-wrong-key-0123456789abcdef", KEY_A, KEY_B) == []


# -- where the provider's own key goes -------------------------------------------------------


def test_the_providers_key_sent_elsewhere_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    caplog.set_level(logging.INFO, logger="llm_kit")
    with running_emulator(EmulatorConfig()) as emu:
        for _ in range(2):
            llm = LLM(model="m", base_url=emu.openai_base_url)
            assert asyncio.run(llm.complete("hi"))  # existing configs keep working
    host = f"127.0.0.1:{emu.port}"
    said = [r for r in caplog.records if "OPENAI_API_KEY" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert host in said[0].getMessage() and "api_key_env" in said[0].getMessage()
    assert OPENAI_KEY not in caplog.text


def test_the_providers_key_sent_to_a_remote_host_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    caplog.set_level(logging.INFO, logger="llm_kit")
    LLM(model="m", base_url="https://gateway.invalid/v1")  # nothing sent: the choice is logged
    LLM(model="m", base_url="https://api.openai.com/v1")  # its own host: nothing to say
    said = [r for r in caplog.records if "OPENAI_API_KEY" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "gateway.invalid" in said[0].getMessage()


def test_naming_the_keys_variable_later_buys_nothing_again(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        config = two_gateway_pipeline(tmp_path, emu.openai_base_url, emu.openai_base_url)
        named = config.read_text()
        unnamed = yaml.safe_load(named)
        for processor in unnamed["processors"]:
            del processor["api_key_env"]
        config.write_text(yaml.safe_dump(unnamed, sort_keys=False))
        first = cli("run", str(config), root=tmp_path, env={"OPENAI_API_KEY": OPENAI_KEY})
        assert first.returncode == 0, first.stderr
        assert emu.stats()["requests"] == 2 * ROWS
        config.write_text(named)  # the same pipeline, each key now from its own variable
        env = {"GW_A_KEY": KEY_A, "GW_B_KEY": KEY_B}
        again = cli("run", str(config), root=tmp_path, env=env)
        assert again.returncode == 0, again.stderr
        assert emu.stats()["requests"] == 2 * ROWS  # before: 16 (every answer bought again)
        assert "different configuration" not in again.stderr
