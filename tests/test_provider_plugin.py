"""A provider added from a module of the test's own, no existing file edited: an llm_kit
``ProviderSpec`` (live codec + batch backend speaking OpenAI's wire format under a new name)
and mmirage's batch adapter for it, loaded by the plain CLI through MMIRAGE_BATCH_PROVIDERS.
Both a live ``llm`` processor (``message_format: acme``) and a ``batch_api`` processor
(``provider: acme``) run through ``mmirage run`` / ``merge`` against the emulator."""

from __future__ import annotations

from pathlib import Path

from batch_spec_support import (
    TESTS,
    batches_created,
    cli_env,
    mmirage,
    read_jsonl,
    shard_rows,
    write_rows,
    write_yaml,
)
from provider_emulator.runner import EmulatorHandle

PLUGIN = """
from dataclasses import dataclass

from llm_kit.providers import ProviderSpec, register_provider
from llm_kit.providers.openai import OpenAICodec
from llm_kit.providers.openai_batch import OpenAIBatchBackend
from mmirage.config.batch_provider import OpenAIBatchConfig
from mmirage.core.process.batch.adapters.openai import OpenAIBatchAdapter
from mmirage.core.process.batch.provider_resolution import BatchProviderConfigRegistry
from mmirage.core.process.batch.registry import BatchAdapterRegistry


class AcmeCodec(OpenAICodec):
    name = "acme"
    default_base_url = "http://127.0.0.1:9/v1"  # never used: the configs give base_url


register_provider(
    ProviderSpec(
        name="acme", codec=AcmeCodec, key_env=("ACME_API_KEY",), batch_backend=OpenAIBatchBackend
    )
)


@dataclass
class AcmeBatchConfig(OpenAIBatchConfig):
    provider: str = "acme"


class AcmeBatchAdapter(OpenAIBatchAdapter):
    provider = "acme"
    config_cls = AcmeBatchConfig


BatchProviderConfigRegistry.register("acme", AcmeBatchConfig)
BatchAdapterRegistry.register("acme", AcmeBatchAdapter)
"""
KEY = "sk-acme-test-key-2718"
QUESTIONS = [f"what is {n} plus {n}?" for n in range(6)]


def _config(root: Path, emu: EmulatorHandle, processor: dict[str, object], kind: str) -> Path:
    data = {
        "processors": [{"model": "acme-small", "base_url": emu.openai_base_url, **processor}],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [
                {
                    "path": write_rows(root / "data.jsonl", [{"q": q} for q in QUESTIONS]),
                    "type": "JSONL",
                    "output_dir": str(root / "out"),
                }
            ],
            "output_format": "jsonl",
            "batch_size": 4,
        },
        "processing_params": {
            "inputs": [{"name": "q", "key": "q"}],
            "outputs": [{"name": "answer", "type": kind, "prompt": "Answer: {{ q }}"}],
            "output_schema": {"q": "{{ q }}", "answer": "{{ answer }}"},
        },
        "execution_params": {"poll_interval_seconds": 0.3},
    }
    return write_yaml(root / "config.yaml", data)


def _env(tmp_path: Path) -> dict[str, str]:
    plugins = tmp_path / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "acme_provider.py").write_text(PLUGIN)
    return cli_env(
        ACME_API_KEY=KEY,
        MMIRAGE_BATCH_PROVIDERS="acme_provider",
        PYTHONPATH=f"{plugins}:{TESTS}",
    )


def _answered(rows: list[dict[str, object]]) -> None:
    assert [row["q"] for row in rows] == QUESTIONS
    for row, question in zip(rows, QUESTIONS, strict=True):
        assert row["__errors__"] is None, row
        assert question in str(row["answer"])  # the echo responder quotes the prompt


def test_a_provider_from_a_plugin_module_runs_live_and_through_its_batch_api(
    emulator: EmulatorHandle, tmp_path: Path
) -> None:
    env = _env(tmp_path)
    batch = tmp_path / "batch"
    batch.mkdir()
    config = _config(
        batch,
        emulator,
        {
            "type": "batch_api",
            "provider": "acme",
            "metadata_output_path": str(batch / "meta" / "batch_metadata.jsonl"),
        },
        "batch_api",
    )
    before = batches_created(emulator)
    submitted = mmirage("run", "--config", config, env=env)
    assert submitted.code == 0, str(submitted)
    assert batches_created(emulator) - before == 1  # the OpenAI wire format, under a new name
    merged = batch / "merged.jsonl"
    done = mmirage("merge", "--config", config, "--output-path", merged, env=env)
    assert done.code == 0, str(done)
    _answered(read_jsonl(merged))

    live = tmp_path / "live"
    live.mkdir()
    config = _config(live, emulator, {"type": "llm", "message_format": "acme"}, "llm")
    ran = mmirage("run", "--config", config, env=env)
    assert ran.code == 0, str(ran)
    _answered(shard_rows(live / "out"))
