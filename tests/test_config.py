"""The YAML configuration layer: every original sample loads, every bad config fails with one
sentence naming the file, the field path and what is allowed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmirage.config import (
    AnthropicBatchConfig,
    BatchApiProcessorConfig,
    BatchProviderConfig,
    ConfigError,
    LLMProcessorConfig,
    OpenAIBatchConfig,
    load_mmirage_config,
    load_mmirage_config_dict,
    parse_output_schema,
)
from mmirage.core.process.batch.provider_resolution import BatchProviderConfigRegistry

HERE = Path(__file__).parent
# Verbatim copies of the original project's configs/*.yaml (v0.1.4).
SAMPLES = sorted((HERE / "configs" / "original").glob("*.yaml"))
BAD = sorted((HERE / "configs" / "bad").glob("*.yaml"))
NO_ENV: dict[str, str] = {}


def minimal(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "processors": [{"type": "llm", "model": "m", "message_format": "local"}],
        "loading_params": {
            "datasets": [{"path": "d.jsonl", "type": "JSONL", "output_dir": "out"}],
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "{{ text }}"}],
            "output_schema": {"answer": "{{ answer }}"},
        },
    }
    config.update(overrides)
    return config


def load(data: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    return load_mmirage_config_dict(data, source="test.yaml", env=NO_ENV if env is None else env)


def error_of(data: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load(data, env)
    return str(info.value)


# -- the original's samples ------------------------------------------------------------------


def test_the_original_samples_are_all_here() -> None:
    assert len(SAMPLES) == 12


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_every_original_sample_loads(path: Path) -> None:
    config = load_mmirage_config(path, env={"SLURM_ARRAY_TASK_ID": "0"})
    assert config.processors and config.processing_params.outputs
    assert config.config_path == str(path.resolve())
    for output in config.processing_params.outputs:
        assert config.processor_for(output).type == output.type


def test_unset_shard_id_variable_means_the_cli_chooses() -> None:
    sample = next(p for p in SAMPLES if p.name == "config_comprehensive.yaml")
    assert load_mmirage_config(sample, env={}).loading_params.shard_id is None
    assert (
        load_mmirage_config(sample, env={"SLURM_ARRAY_TASK_ID": "3"}).loading_params.shard_id == 3
    )


def test_sample_values_are_typed() -> None:
    sample = next(p for p in SAMPLES if p.name == "config_mock_anthropic_batch.yaml")
    config = load_mmirage_config(sample, env={})
    processor = config.processors[0]
    assert isinstance(processor, BatchApiProcessorConfig)
    assert isinstance(processor.provider_config, AnthropicBatchConfig)
    assert processor.provider_config.max_tokens == 8192
    assert processor.provider_config.oversized_request_policy == "isolate"
    output = config.processing_params.outputs[0]
    assert output.type == "batch_api" and output.is_json  # type: ignore[union-attr]
    assert output.schema.names == ["question", "answer"]  # type: ignore[union-attr]
    assert config.execution_params.report_dir == os.path.expanduser("~/reports")


# -- the corpus of bad configs ---------------------------------------------------------------


def _expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), f"{path.name} must start with '# expect: <message>'"
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_config_fails_with_its_message(path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_mmirage_config(path, env={})
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert _expected(path) in message
    assert "\n" not in message  # one readable sentence


def test_good_fixture_loads_with_its_additions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/tester")
    env = {"USER": "ann", "UNITS": "rows", "HOME": "/home/tester"}
    config = load_mmirage_config(HERE / "configs" / "good" / "multi_processor.yaml", env=env)
    fast, smart, batch = config.processors
    assert isinstance(fast, LLMProcessorConfig) and fast.base_url == "http://127.0.0.1:8000/v1"
    assert fast.worker_concurrency == 32 and fast.rpm == 600
    assert isinstance(batch, BatchApiProcessorConfig)
    assert isinstance(batch.provider_config, OpenAIBatchConfig)
    assert batch.provider == "openai"
    assert batch.provider_config.metadata_output_path == "/home/tester/receipts/meta.jsonl"
    assert batch.provider_config.max_completion_tokens == 512
    assert config.loading_params.num_shards == 4
    assert config.loading_params.datasets[0].type == "JSONL"
    assert config.loading_params.datasets[0].output_dir == "/home/tester/out/rows"
    summary, grade, batched = config.processing_params.outputs
    assert config.processor_for(summary) is fast
    assert config.processor_for(grade) is smart
    assert config.processor_for(batched) is batch
    # Prompts and the output schema are data: no expansion, even of set variables.
    assert summary.prompt == "Summarise for $HOME and ${USER}: {{ text }}"  # type: ignore[union-attr]
    assert config.processing_params.output_schema["note"] == "cost: $5 per ${UNITS}"
    assert grade.output_type == "JSON"  # type: ignore[union-attr]
    assert config.execution_params.edf_env is None and config.execution_params.reservation is None


# -- environment variables -------------------------------------------------------------------


def test_env_variable_expands_in_values_and_default_applies() -> None:
    data = minimal()
    data["loading_params"]["num_shards"] = "${SHARDS}"
    data["loading_params"]["batch_size"] = "${BATCH:-8}"
    data["loading_params"]["state_dir"] = "$ROOT/state"
    config = load(data, {"SHARDS": "6", "ROOT": "/scratch"})
    assert config.loading_params.num_shards == 6
    assert config.loading_params.batch_size == 8
    assert config.loading_params.state_dir == "/scratch/state"


def test_unset_variable_is_an_error_naming_variable_and_field() -> None:
    data = minimal()
    data["loading_params"]["num_shards"] = "$SLURM_ARRAY_TASK_COUNT"
    message = error_of(data)
    assert message.startswith("test.yaml: loading_params.num_shards: ")
    assert "environment variable 'SLURM_ARRAY_TASK_COUNT' is not set" in message


def test_prompt_with_home_is_left_untouched() -> None:
    data = minimal()
    data["processing_params"]["outputs"][0]["prompt"] = "Path $HOME and ${MISSING}: {{ text }}"
    config = load(data, {"HOME": "/root"})
    assert config.processing_params.outputs[0].prompt == "Path $HOME and ${MISSING}: {{ text }}"


def test_double_dollar_is_a_literal_dollar() -> None:
    data = minimal()
    data["execution_params"] = {"job_name": "cost$$job"}
    assert load(data).execution_params.job_name == "cost$job"


def test_string_num_shards_that_is_not_a_number_fails() -> None:
    data = minimal()
    data["loading_params"]["num_shards"] = "four"
    assert "loading_params.num_shards: must be a valid integer" in error_of(data)


# -- defaults --------------------------------------------------------------------------------


def test_state_dir_default_depends_on_the_config_file(tmp_path: Path) -> None:
    text = yaml.safe_dump(minimal())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "job.yaml").write_text(text)
    (tmp_path / "b" / "job.yaml").write_text(text)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    first = load_mmirage_config(tmp_path / "a" / "job.yaml", env=env).loading_params.state_dir
    second = load_mmirage_config(tmp_path / "b" / "job.yaml", env=env).loading_params.state_dir
    assert first != second
    assert first is not None and first.startswith(
        str(tmp_path / "cache" / "mmirage" / "state" / "job-")
    )
    assert (
        load_mmirage_config(tmp_path / "a" / "job.yaml", env=env).loading_params.state_dir == first
    )


def test_defaults_match_the_original() -> None:
    config = load(minimal())
    execution = config.execution_params
    assert (execution.mode, execution.retry, execution.merge, execution.max_retries) == (
        "local",
        False,
        False,
        3,
    )
    assert (execution.gpus, execution.cpus_per_task, execution.time_limit) == (4, 288, "11:59:59")
    assert execution.job_name == "mmirage-sharded" and execution.hf_home == os.path.expanduser(
        "~/hf"
    )
    loading = config.loading_params
    assert (loading.num_shards, loading.shard_id, loading.batch_size) == (1, None, 1)
    processing = config.processing_params
    assert processing.remove_columns is False and processing.cast_images is True
    llm = config.processors[0]
    assert isinstance(llm, LLMProcessorConfig)
    assert llm.server_args.model_path == "none" and llm.server_args.trust_remote_code is True
    assert llm.chat_template == "" and llm.default_sampling_params == {}


def test_batch_provider_defaults_follow_the_spec() -> None:
    openai = OpenAIBatchConfig()
    assert (openai.model, openai.batch_endpoint, openai.completion_window) == (
        "gpt-4.1-mini",
        "/v1/chat/completions",
        "24h",
    )
    assert openai.max_chunk_bytes == 52428800 and openai.max_requests_per_chunk is None
    assert openai.metadata_output_path == "" and openai.metadata == {}
    anthropic = AnthropicBatchConfig()
    assert (anthropic.model, anthropic.max_tokens, anthropic.temperature) == (
        "claude-haiku-4-5",
        8192,
        None,
    )


# -- batch providers -------------------------------------------------------------------------


def batch_config(**provider: Any) -> dict[str, Any]:
    data = minimal(processors=[{"type": "batch_api", **provider}])
    data["processing_params"]["outputs"][0]["type"] = "batch_api"
    return data


@dataclass
class MistralBatchConfig(BatchProviderConfig):
    provider: str = "mistral"
    model: str = "mistral-small-latest"


@pytest.fixture
def mistral() -> Iterator[None]:
    BatchProviderConfigRegistry.register("mistral", MistralBatchConfig)
    yield
    BatchProviderConfigRegistry.unregister("mistral")


@pytest.mark.usefixtures("mistral")
def test_spec_custom_provider_registers_and_loads_from_yaml(tmp_path: Path) -> None:
    path = tmp_path / "mistral.yaml"
    path.write_text(
        yaml.safe_dump(
            batch_config(
                provider="mistral",
                model="mistral-small-latest",
                metadata_output_path="/scratch/mistral_meta.jsonl",
            )
        )
    )
    config = load_mmirage_config(path, env={})
    processor = config.processors[0]
    assert isinstance(processor, BatchApiProcessorConfig)
    assert type(processor.provider_config) is MistralBatchConfig
    assert processor.provider_config.metadata_output_path == "/scratch/mistral_meta.jsonl"
    assert processor.provider_config.max_chunk_bytes == 52428800  # inherited default
    # Inherited checks and strict keys apply to the user's subclass too.
    assert "processors[0].max_chunk_bytes: must be >= 1, got 0" in error_of(
        batch_config(provider="mistral", max_chunk_bytes=0)
    )
    assert "unknown key 'temperature'" in error_of(batch_config(provider="mistral", temperature=1))
    assert "mistral" in BatchProviderConfigRegistry.available()


def test_registry_refuses_a_non_dataclass() -> None:
    class NotADataclass(BatchProviderConfig):
        pass

    with pytest.raises(TypeError, match="@dataclass subclass of BatchProviderConfig"):
        BatchProviderConfigRegistry.register("x", NotADataclass)


def test_registry_clear_keeps_built_ins_available() -> None:
    BatchProviderConfigRegistry.clear()
    assert BatchProviderConfigRegistry.resolve(" OPENAI ") is OpenAIBatchConfig
    assert BatchProviderConfigRegistry.available() == ["anthropic", "gemini", "openai"]


def test_oversized_policy_is_case_insensitive_and_checked() -> None:
    config = load(batch_config(provider="openai", oversized_request_policy="REJECT"))
    assert config.processors[0].provider_config.oversized_request_policy == "reject"
    message = error_of(batch_config(provider="openai", oversized_request_policy="split"))
    assert "processors[0].oversized_request_policy: must be 'isolate' or 'reject'" in message


def test_openai_sampling_fields_are_checked() -> None:
    config = load(
        batch_config(provider="openai", temperature=0.5, top_p=0.9, max_tokens=100, seed=3)
    )
    provider = config.processors[0].provider_config
    assert (provider.temperature, provider.top_p, provider.max_tokens, provider.seed) == (
        0.5,
        0.9,
        100,
        3,
    )
    assert "processors[0].temperature: must be in [0, 2], got 3.0" in error_of(
        batch_config(provider="openai", temperature=3)
    )
    assert "set only one" in error_of(
        batch_config(provider="openai", max_tokens=5, max_completion_tokens=5)
    )


def test_openai_metadata_must_fit_beside_the_pairs_mmirage_adds() -> None:
    pairs = {f"k{i:02d}": "v" for i in range(14)}
    config = load(batch_config(provider="openai", metadata=pairs))
    assert config.processors[0].provider_config.metadata == pairs
    assert "processors[0].metadata: holds 15 pairs; OpenAI keeps 16" in error_of(
        batch_config(provider="openai", metadata={**pairs, "k14": "v"})
    )
    assert "'chunk_id' is set by mmirage on each batch" in error_of(
        batch_config(provider="openai", metadata={"chunk_id": "mine"})
    )
    assert "values of 512" in error_of(batch_config(provider="openai", metadata={"k": "v" * 513}))


def test_missing_provider_lists_the_choices() -> None:
    message = error_of(batch_config())
    assert (
        "processors[0].provider: is required: one of ['anthropic', 'gemini', 'openai']" in message
    )


# -- output schemas --------------------------------------------------------------------------


def test_output_schema_to_json_schema_and_pydantic_model() -> None:
    schema = parse_output_schema(
        {
            "score": {"type": "integer", "min": "0", "max": 10},
            "label": None,
            "class": "str",
            "tags": "list[string]",
            "detail": {"type": "object", "properties": {"ok": "boolean"}},
        },
        "grade",
    )
    json_schema = schema.json_schema()
    assert json_schema["required"] == ["score", "label", "class", "tags", "detail"]
    assert json_schema["additionalProperties"] is False
    assert json_schema["properties"]["score"] == {"type": "integer", "minimum": 0, "maximum": 10}
    assert json_schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    model = schema.pydantic_model("Grade")
    answer = model.model_validate(
        {"score": 7, "label": "a", "class": "b", "tags": ["x"], "detail": {"ok": True}}
    )
    assert answer.model_dump(by_alias=True)["class"] == "b"
    with pytest.raises(ValueError):
        model.model_validate(
            {"score": 11, "label": "a", "class": "b", "tags": [], "detail": {"ok": True}}
        )
    assert "class" in model.model_json_schema(by_alias=True)["properties"]


def test_list_form_is_all_strings() -> None:
    schema = parse_output_schema(["question", "answer"], "qa")
    assert [f.type for f in schema.fields] == ["str", "str"]


def test_enum_field_is_a_closed_label_set() -> None:
    schema = parse_output_schema({"label": {"type": "str", "enum": ["pos", "neg"]}}, "s")
    assert schema.json_schema()["properties"]["label"] == {"type": "string", "enum": ["pos", "neg"]}
    model = schema.pydantic_model("S")
    assert model.model_validate({"label": "neg"}).model_dump() == {"label": "neg"}
    with pytest.raises(ValueError):
        model.model_validate({"label": "meh"})


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"type": "str", "enum": []}, "'enum' must be a non-empty list of strings"),
        ({"type": "str", "enum": "pos"}, "'enum' must be a non-empty list of strings"),
        ({"type": "str", "enum": ["a", "a"]}, "'enum' repeats a value"),
        ({"type": "int", "enum": ["a"]}, "Unknown key(s) ['enum']"),
    ],
)
def test_bad_enum_is_refused(spec: dict[str, object], problem: str) -> None:
    data = minimal()
    data["processing_params"]["outputs"][0].update(
        output_type="JSON", output_schema={"label": spec}
    )
    message = error_of(data)
    assert "outputs[0].output_schema.label" in message
    assert problem in message


def test_bool_bound_is_refused() -> None:
    data = minimal()
    data["processing_params"]["outputs"][0].update(
        output_type="JSON", output_schema={"n": {"type": "int", "max": True}}
    )
    message = error_of(data)
    assert "outputs[0].output_schema.n.max: Field 'n' in output_schema of 'answer'" in message
    assert message.endswith("'max' must be a number.")


def test_schema_on_a_plain_output_is_refused() -> None:
    data = minimal()
    data["processing_params"]["outputs"][0]["output_schema"] = ["a"]
    assert "output_schema: is only used with output_type: JSON" in error_of(data)


# -- misc ------------------------------------------------------------------------------------


def test_image_gen_is_accepted_structurally() -> None:
    data = minimal(
        processors=[
            {"type": "image_gen", "backend": "external", "external": {"base_url": "http://x/v1"}}
        ]
    )
    data["processing_params"]["outputs"] = [
        {"name": "img", "type": "image_gen", "prompt": "{{ text }}"}
    ]
    data["processing_params"]["output_schema"] = {"image": "{{ img }}"}
    config = load(data)
    assert config.processing_params.outputs[0].filename_template.startswith("generated_")
    message = error_of({**data, "processors": [{"type": "image_gen", "backend": "sglang"}]})
    assert "processors[0].sglang: backend 'sglang' needs an 'sglang:' block" in message


def test_missing_file_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_mmirage_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("processors: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: is not valid YAML"):
        load_mmirage_config(bad)


def test_edf_env_must_exist_when_set(tmp_path: Path) -> None:
    data = minimal(execution_params={"edf_env": str(tmp_path / "missing.toml")})
    assert "execution_params.edf_env: EDF environment file not found" in error_of(data)


def test_importing_the_package_stays_light() -> None:
    code = (
        "import sys, mmirage.config, mmirage.config.batch_provider;"
        "print(any(m in sys.modules for m in ('pydantic', 'yaml', 'jinja2')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
