"""The spec's custom provider (Batch API page, "Provider-Agnostic Architecture & Custom
Providers"): its MistralBatchConfig and MistralBatchAdapter as printed there, the ``...`` bodies
filled with a working client of the emulator's OpenAI-compatible batch endpoints, registered,
loaded from YAML, given its key, and loaded as a plugin named in MMIRAGE_BATCH_PROVIDERS."""

# The two classes are the spec's code as printed (its typing.Dict, its import order, its
# imports between the definitions, its long comment line): those lint rules are off here.
# ruff: noqa: E402, E501, I001, UP006, UP035

# -- spec: 1. Custom Provider Config ---------------------------------------------------------------

from dataclasses import dataclass
from mmirage.config.batch_provider import BatchProviderConfig


@dataclass
class MistralBatchConfig(BatchProviderConfig):
    provider: str = "mistral"
    model: str = "mistral-small-latest"


# -- spec: 2. Custom Submission Adapter (the `...` bodies filled in) -----------------------------

from typing import Any, Dict, Sequence
from mmirage.core.process.batch.adapter import (
    BatchSubmissionAdapter,
    BatchSubmissionResult,
)
from mmirage.config.batch_provider import BatchProviderConfig


class MistralBatchAdapter(BatchSubmissionAdapter):
    # Each key must be set as an <PROVIDER>_<KEY> environment variable, e.g. MISTRAL_API_KEY.
    # Non-alphanumeric characters in the provider name become '_': azure-openai -> AZURE_OPENAI_API_KEY.
    required_credentials = ("api_key",)

    def build_request(
        self,
        custom_id: str,
        payload: Dict[str, Any],
        config: BatchProviderConfig,
    ) -> Dict[str, Any]:
        # Formats the internal request payload into the provider's API request format
        if not payload.get("messages"):
            raise ValueError(f"request {custom_id} has no messages")
        return {
            "custom_id": custom_id,
            "params": {
                "model": config.model,
                "messages": payload["messages"],
            },
        }

    def estimate_request_bytes(self, request: Dict[str, Any]) -> int:
        # Returns the estimated serialized UTF-8 bytes for request size-based chunking
        import json

        return len(json.dumps(request).encode("utf-8"))

    def submit_chunk(
        self,
        chunk_id: str,
        requests: Sequence[Dict[str, Any]],
        config: BatchProviderConfig,
    ) -> Dict[str, Any]:
        # Submits the chunk requests to the provider API and returns the raw response
        lines = [
            {"custom_id": r["custom_id"], "method": "POST", "url": CHAT, "body": r["params"]}
            for r in requests
        ]
        uploaded = upload_jsonl(self.credentials["api_key"], f"{chunk_id}.jsonl", lines)
        batch = call_json(
            self.credentials["api_key"],
            "POST",
            "/batches",
            {
                "input_file_id": uploaded["id"],
                "endpoint": CHAT,
                "completion_window": "24h",
                "metadata": {"chunk_id": chunk_id},
            },
        )
        return {"id": batch["id"], "status": batch["status"], "chunk_id": chunk_id}

    def parse_submission_result(
        self,
        raw_result: Dict[str, Any],
    ) -> BatchSubmissionResult:
        # Wraps the raw submission response in a normalized BatchSubmissionResult.
        # Map your provider statuses to 'completed', 'failed', 'in_progress' or
        # 'unknown', mmirage check reads them without knowing your vocabulary.
        return BatchSubmissionResult(
            provider_batch_id=raw_result["id"],
            status=self._normalize_status(raw_result["status"]),
            raw_response=raw_result,
        )

    def check_batch_status(
        self,
        provider_batch_id: str,
        config: BatchProviderConfig,
    ) -> BatchSubmissionResult:
        # Queries the provider and returns the latest status
        batch = call_json(self.credentials["api_key"], "GET", f"/batches/{provider_batch_id}")
        return self.parse_submission_result(batch)

    def retrieve_results(
        self,
        provider_batch_id: str,
        config: BatchProviderConfig,
    ) -> Sequence[Dict[str, Any]]:
        # Downloads/retrieves completed outputs and normalizes each row.
        # Ensure text generations are mapped to the "generated_text" key so
        # the collector can reconstruct the original dataset rows neutrally.
        # Expose any reported usage as "input_tokens" and "output_tokens",
        # omitting both keys when the provider reports none.
        key = self.credentials["api_key"]
        batch = call_json(key, "GET", f"/batches/{provider_batch_id}")
        if not self.parse_submission_result(batch).is_terminal:
            raise RuntimeError(f"batch {provider_batch_id} is still {batch['status']}")
        rows: list[Dict[str, Any]] = []
        for file_id in (batch.get("output_file_id"), batch.get("error_file_id")):
            if file_id:
                rows.extend(result_row(line) for line in download_jsonl(key, file_id))
        return rows


# -- spec: Registry Integration (in a function: tests register and unregister it) ----------------


def register_mistral() -> None:
    from mmirage.core.process.batch.provider_resolution import BatchProviderConfigRegistry
    from mmirage.core.process.batch.registry import BatchAdapterRegistry

    # Register the provider configuration class
    BatchProviderConfigRegistry.register("mistral", MistralBatchConfig)

    # Register the provider submission adapter
    BatchAdapterRegistry.register("mistral", MistralBatchAdapter)


# -- the filled-in bodies' HTTP: plain urllib to an OpenAI-compatible server -----------------------

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle
from mmirage.config import BatchApiProcessorConfig, load_mmirage_config
from mmirage.config.plugins import PROVIDER_PLUGINS
from mmirage.core.process.batch.adapter import COMPLETED, MissingCredentialsError
from mmirage.core.process.batch.provider_resolution import BatchProviderConfigRegistry
from mmirage.core.process.batch.registry import BatchAdapterRegistry, load_provider_plugins

CHAT = "/v1/chat/completions"
KEY = "mistral-test-key-2718"
BASE_URL_ENV = "MISTRAL_BASE_URL"  # where the adapter's requests go (the emulator in tests)


def call_json(api_key: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    return send(api_key, method, path, data, "application/json")


def upload_jsonl(api_key: str, name: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    boundary = uuid.uuid4().hex
    content = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    form = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    return send(api_key, "POST", "/files", form, f"multipart/form-data; boundary={boundary}")


def download_jsonl(api_key: str, file_id: str) -> Iterator[dict[str, Any]]:
    request = urllib.request.Request(
        f"{os.environ[BASE_URL_ENV]}/files/{file_id}/content",
        headers={"Authorization": f"Bearer {api_key}"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        for line in reply.read().splitlines():
            if line.strip():
                yield json.loads(line)


def send(api_key: str, method: str, path: str, data: bytes | None, kind: str) -> dict[str, Any]:
    request = urllib.request.Request(
        os.environ[BASE_URL_ENV] + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": kind},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer: dict[str, Any] = json.loads(reply.read())
        return answer


def result_row(line: dict[str, Any]) -> dict[str, Any]:
    """One BatchRequestOutput line → the contract's result row."""
    row: dict[str, Any] = {"custom_id": line["custom_id"]}
    response = line.get("response") or {}
    body = response.get("body") or {}
    if response.get("status_code") == 200:
        row.update(status="succeeded", generated_text=body["choices"][0]["message"]["content"])
        usage = body.get("usage")
        if usage:
            row.update(
                input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]
            )
        return row
    error = body.get("error") or line.get("error") or {}
    row.update(status="error", error_message=error.get("message") or "failed")
    return row


# -- tests -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorHandle]:
    with running_emulator(EmulatorConfig(seed=3)) as handle:
        yield handle


@pytest.fixture
def mistral(emu: EmulatorHandle, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(BASE_URL_ENV, emu.openai_base_url)
    register_mistral()
    yield
    BatchProviderConfigRegistry.unregister("mistral")
    BatchAdapterRegistry.unregister("mistral")


def write_config(tmp_path: Path) -> Path:
    """The spec's "Config Usage" block in a complete pipeline config."""
    path = tmp_path / "mistral.yaml"
    path.write_text(
        f"""
processors:
  - type: batch_api
    provider: mistral
    model: mistral-small-latest
    metadata_output_path: {tmp_path}/mistral_meta.jsonl

loading_params:
  datasets:
    - path: {tmp_path}/data.jsonl
      type: JSONL
      output_dir: {tmp_path}/out

processing_params:
  inputs:
    - name: question
      key: question
  outputs:
    - name: answer
      type: batch_api
      output_type: plain
      prompt: "Answer concisely: {{{{ question }}}}"
  output_schema:
    question: "{{{{ question }}}}"
    answer: "{{{{ answer }}}}"
"""
    )
    return path


def wait_terminal(adapter: Any, batch_id: str, config: Any) -> BatchSubmissionResult:
    deadline = time.monotonic() + 15
    while True:
        result: BatchSubmissionResult = adapter.check_batch_status(batch_id, config)
        if result.is_terminal or time.monotonic() > deadline:
            return result
        time.sleep(0.05)


@pytest.mark.usefixtures("mistral")
def test_spec_example_loads_from_yaml_and_runs_a_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_mmirage_config(write_config(tmp_path), env={})
    processor = config.processors[0]
    assert isinstance(processor, BatchApiProcessorConfig)
    provider_config = processor.provider_config
    assert type(provider_config) is MistralBatchConfig
    assert provider_config.model == "mistral-small-latest"
    assert provider_config.metadata_output_path == f"{tmp_path}/mistral_meta.jsonl"
    assert "mistral" in BatchAdapterRegistry.available()

    monkeypatch.setenv("MISTRAL_API_KEY", KEY)
    adapter = BatchAdapterRegistry.create(provider_config)
    assert type(adapter) is MistralBatchAdapter and adapter.credentials == {"api_key": KEY}

    requests = [
        adapter.build_request(
            f"answer-text-{n}",
            {"messages": [{"role": "user", "content": f"question {n}"}], "response_schema": None},
            provider_config,
        )
        for n in range(1, 5)
    ]
    assert requests[0] == {
        "custom_id": "answer-text-1",
        "params": {
            "model": "mistral-small-latest",
            "messages": [{"role": "user", "content": "question 1"}],
        },
    }
    assert adapter.estimate_request_bytes(requests[0]) == len(json.dumps(requests[0]))
    raw = adapter.submit_chunk("chunk-000001", requests, provider_config)
    submitted = adapter.parse_submission_result(raw)
    assert raw["chunk_id"] == "chunk-000001" and submitted.status == "in_progress"
    final = wait_terminal(adapter, submitted.provider_batch_id, provider_config)
    assert final.status == COMPLETED
    rows = sorted(
        adapter.retrieve_results(final.provider_batch_id, provider_config),
        key=lambda row: row["custom_id"],
    )
    assert [row["custom_id"] for row in rows] == [f"answer-text-{n}" for n in range(1, 5)]
    assert rows[0]["generated_text"] == "echo: question 1"
    assert all(row["status"] == "succeeded" and row["input_tokens"] > 0 for row in rows)


@pytest.mark.usefixtures("mistral")
def test_the_mistral_key_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MISTRAL_API_KEY", raising=False)
    with pytest.raises(MissingCredentialsError, match="MISTRAL_API_KEY"):
        BatchAdapterRegistry.create(MistralBatchConfig())
    adapter = BatchAdapterRegistry.create(MistralBatchConfig(), allow_missing_credentials=True)
    assert adapter.credentials == {}


def test_a_plugin_named_in_the_environment_registers_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    BatchAdapterRegistry.unregister("mistral")
    BatchProviderConfigRegistry.unregister("mistral")
    # A user's plugin module: importing it registers the provider (here: this file's example).
    plugin = f"mistral_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{plugin}.py").write_text(
        f"import importlib\n\nimportlib.import_module({__name__!r}).register_mistral()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(PROVIDER_PLUGINS.env, f" {plugin} ,")
    monkeypatch.setattr(PROVIDER_PLUGINS, "loaded", False)
    try:
        load_provider_plugins()
        assert BatchAdapterRegistry.resolve("mistral") is MistralBatchAdapter
        assert BatchProviderConfigRegistry.get_config_cls("mistral") is MistralBatchConfig
        assert plugin in sys.modules
    finally:
        BatchAdapterRegistry.unregister("mistral")
        BatchProviderConfigRegistry.unregister("mistral")
        sys.modules.pop(plugin, None)


def test_a_plugin_that_fails_to_import_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PROVIDER_PLUGINS.env, "no_such_mistral_plugin_module")
    monkeypatch.setattr(PROVIDER_PLUGINS, "loaded", False)
    with pytest.raises(ImportError, match="no_such_mistral_plugin_module"):
        load_provider_plugins()


def test_a_provider_registered_at_runtime_reaches_parallel_shard_processes(
    emu: EmulatorHandle, tmp_path: Path
) -> None:
    """The spec's registration, in an application's bootstrap that then runs the CLI: the
    shards it starts as their own processes (local_parallel_shards, like SLURM's tasks) know
    the provider too."""
    import yaml

    data = yaml.safe_load(write_config(tmp_path).read_text())
    data["loading_params"].update(num_shards=2, output_format="jsonl")
    data["execution_params"] = {"local_parallel_shards": 2}
    config = tmp_path / "parallel.yaml"
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "data.jsonl").write_text(
        "".join(json.dumps({"question": f"q{i}"}) + "\n" for i in range(6))
    )
    boot = tmp_path / "boot.py"
    # The application's module sits beside its script (on the script's path only, as
    # sys.path[0] would put it): the shard processes, started elsewhere, find it all the same.
    boot.write_text(
        f"import sys\n\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"import {__name__} as app\n\napp.register_mistral()\n\n"
        "from mmirage.cli import entry\n\nentry()\n"
    )
    env = {**os.environ, "MISTRAL_API_KEY": KEY, BASE_URL_ENV: emu.openai_base_url}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, str(boot), "run", str(config)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[shard 1]" in done.stderr  # it did run in child processes
    published = sorted((tmp_path / "out").glob("shard-*-of-2.jsonl"))
    assert len(published) == 2
    answers = [json.loads(line)["answer"] for p in published for line in p.read_text().split()]
    assert len(answers) == 6 and all(a.startswith("__BATCH_SUBMITTED__:") for a in answers)


def test_a_provider_defined_in_the_bootstrap_script_is_refused_before_any_shard(
    tmp_path: Path,
) -> None:
    import yaml

    data = yaml.safe_load(write_config(tmp_path).read_text())
    data["loading_params"]["num_shards"] = 2
    data["execution_params"] = {"local_parallel_shards": 2}
    config = tmp_path / "parallel.yaml"
    config.write_text(yaml.safe_dump(data))
    (tmp_path / "data.jsonl").write_text(json.dumps({"question": "q"}) + "\n")
    boot = tmp_path / "boot.py"
    boot.write_text(
        f"from {__name__} import MistralBatchAdapter, MistralBatchConfig\n"
        "from mmirage.core.process.batch.provider_resolution import "
        "BatchProviderConfigRegistry\n"
        "from mmirage.core.process.batch.registry import BatchAdapterRegistry\n\n\n"
        "class Local(MistralBatchConfig):\n    pass\n\n\n"
        "Local = __import__('dataclasses').dataclass(Local)\n"
        "BatchProviderConfigRegistry.register('mistral', Local)\n"
        "BatchAdapterRegistry.register('mistral', MistralBatchAdapter)\n\n"
        "from mmirage.cli import entry\n\nentry()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent), "MISTRAL_API_KEY": KEY}
    done = subprocess.run(
        [sys.executable, str(boot), "run", str(config)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "batch provider 'mistral' is registered with Local, defined in the script run" in (
        done.stderr
    )
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("shard-*"))


@pytest.mark.usefixtures("mistral")
def test_a_slurm_job_script_exports_the_providers_registered_at_runtime(tmp_path: Path) -> None:
    from mmirage.config.execution import ExecutionParams
    from mmirage.config.plugins import FORWARDED_ENV
    from mmirage.executors.forwarding import shard_env
    from mmirage.executors.slurm_script import JobSpec, render_job_script

    env = shard_env(load_mmirage_config(write_config(tmp_path), env={}))
    assert json.loads(env[FORWARDED_ENV]) == {
        "providers": {
            "mistral": {
                "adapter": f"{__name__}:MistralBatchAdapter",
                "config": f"{__name__}:MistralBatchConfig",
            }
        },
        "paths": [str(Path(__file__).parent)],  # where the shard finds this module
    }
    spec = JobSpec(tmp_path / "c.yaml", (0, 1), tmp_path, env=tuple(env.items()))
    script = render_job_script(ExecutionParams(mode="slurm", account="a"), spec)
    export = next(line for line in script.splitlines() if FORWARDED_ENV in line)
    assert export.startswith(f"export {FORWARDED_ENV}='{{")
    assert script.index(export) < script.index("exec ")
    openai_only = load_mmirage_config(write_config(tmp_path), env={})
    openai_only.processors[0].provider_config.provider = "openai"  # type: ignore[attr-defined]
    assert shard_env(openai_only) == {}  # only the providers the config uses travel


def test_a_forwarded_provider_replaces_a_built_in_name_and_a_missing_one_is_one_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In a shard process: a custom class under a built-in's name wins over the built-in, as in
    the process that registered it; a module that cannot be imported here names the fix."""
    from mmirage.config.plugins import FORWARDED_ENV
    from mmirage.errors import UserError

    forwarded = {
        "openai": {"config": f"{__name__}:MistralBatchConfig"},
        "gone": {"config": "no_such_module_here:Config"},
    }
    monkeypatch.setenv(FORWARDED_ENV, json.dumps({"providers": forwarded, "paths": []}))
    try:
        assert BatchProviderConfigRegistry.get_config_cls("openai") is MistralBatchConfig
        with pytest.raises(UserError, match=r"batch provider 'gone' was registered .*PYTHONPATH"):
            BatchProviderConfigRegistry.get_config_cls("gone")
    finally:
        BatchProviderConfigRegistry.clear()
