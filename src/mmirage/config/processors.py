"""``processors[]``: what computes outputs. ``type`` picks the class; ``name`` tells apart
several processors of one type (each output names the one it uses)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from llm_kit.providers import provider_names, provider_spec
from mmirage.config.batch_provider import BatchProviderConfig
from mmirage.config.errors import FieldError
from mmirage.config.fields import (
    NonEmptyStr,
    PathStr,
    PositiveFloat,
    PositiveInt,
)

# Any provider registered with llm_kit (llm_kit.providers), checked when the config is built.
MessageFormat = str
# How an OpenAI-compatible server is asked for a JSON output's schema (llm_kit.dialects).
StructuredOutput = Literal[
    "auto", "json_schema", "json_object", "guided_json", "ollama_format", "prompt"
]


def _default_tp_size() -> int:
    # The original's default: the GPUs SLURM gave this node, else 1.
    raw = os.environ.get("SLURM_GPUS_ON_NODE", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


@dataclass
class ServerArgs:
    """Engine settings for a locally served model (SGLang-compatible names)."""

    model_path: str = "none"
    tp_size: PositiveInt = field(default_factory=_default_tp_size)
    trust_remote_code: bool = True
    disable_custom_all_reduce: bool = False
    extra_engine_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class LLMProcessorConfig:
    """``type: llm`` — live generation through llm_kit: an API, an OpenAI-compatible server
    (``base_url``), or the embedded local model (``message_format: local``)."""

    TYPE: ClassVar[str] = "llm"

    type: Literal["llm"] = "llm"
    name: str | None = None
    server_args: ServerArgs = field(default_factory=ServerArgs)
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    chat_template: str = ""
    # Our additions: where and how to call the model.
    model: str | None = None
    base_url: str | None = None
    message_format: MessageFormat | None = None
    # auto: the server's first form that it does not refuse, learned at the first refusal.
    structured_output: StructuredOutput = "auto"
    # Live pipeline pacing (None: llm_kit's BatchConfig default).
    worker_concurrency: PositiveInt | None = None
    input_buffer_size: PositiveInt | None = None
    rpm: PositiveInt | None = None
    tpm: PositiveInt | None = None
    max_retries: int | None = None
    validation_retries: int | None = None
    request_timeout: PositiveFloat | None = None

    def __post_init__(self) -> None:
        known = provider_names()
        if self.message_format is not None and self.message_format not in known:
            choices = ", ".join(repr(name) for name in known[:-1]) + f" or {known[-1]!r}"
            raise FieldError("message_format", f"must be {choices}, got {self.message_format!r}")
        for name in ("max_retries", "validation_retries"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise FieldError(name, f"must be >= 0, got {value}")
        if (
            self.structured_output != "auto"
            and self.message_format is not None
            and not provider_spec(self.message_format).speaks_dialects
        ):
            raise FieldError(
                "structured_output",
                f"{self.structured_output!r} is for OpenAI-compatible servers; "
                f"message_format {self.message_format} has one native form: leave it 'auto'",
            )

    @property
    def model_name(self) -> str:
        """The model to call: ``model``, else ``server_args.model_path``."""
        return self.model or self.server_args.model_path


@dataclass
class BatchApiProcessorConfig:
    """``type: batch_api`` — provider fields sit inline in YAML and land in ``provider_config``,
    an instance of the class registered for ``provider``."""

    TYPE: ClassVar[str] = "batch_api"

    provider_config: BatchProviderConfig
    type: Literal["batch_api"] = "batch_api"
    name: str | None = None

    @property
    def provider(self) -> str:
        return self.provider_config.provider


@dataclass
class CustomProcessorConfig:
    """``type: custom`` — a user Python function run in a process pool."""

    TYPE: ClassVar[str] = "custom"

    script_path: PathStr
    function_name: NonEmptyStr
    type: Literal["custom"] = "custom"
    name: str | None = None
    max_workers: PositiveInt = 1
    timeout_ms: PositiveInt | None = None
    max_timeouts: PositiveInt = 1
    max_errors: PositiveInt = 1
    fallback_value: Any = None
    start_method: Literal["spawn", "fork", "forkserver"] = "spawn"

    def __post_init__(self) -> None:
        if not self.script_path.strip():
            raise FieldError("script_path", "must be a non-empty path to a Python file")


@dataclass
class ExternalImageBackend:
    base_url: NonEmptyStr
    api_key: str | None = None
    timeout_seconds: PositiveFloat = 900
    request_model: str | None = None
    max_concurrent_requests: PositiveInt = 1


@dataclass
class SGLangImageBackend:
    model_path: NonEmptyStr
    port: int | None = None
    num_gpus: PositiveInt = 1
    dtype: str | None = None
    startup_timeout_seconds: PositiveFloat = 900
    extra_server_args: list[str] = field(default_factory=list)
    api_key: str | None = None
    timeout_seconds: PositiveFloat = 900
    request_model: str | None = None
    max_concurrent_requests: PositiveInt = 1


@dataclass
class ImageGenProcessorConfig:
    """``type: image_gen`` — accepted and checked so that configs load; no processor runs it yet."""

    TYPE: ClassVar[str] = "image_gen"

    type: Literal["image_gen"] = "image_gen"
    name: str | None = None
    backend: Literal["external", "sglang"] = "external"
    external: ExternalImageBackend | None = None
    sglang: SGLangImageBackend | None = None
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    parallel_inference: bool = True
    parallel_chunk_size: PositiveInt | None = 4
    output_dir: PathStr = "~/.cache/MMIRAGE/generated_images"
    file_format: str = "png"

    def __post_init__(self) -> None:
        if self.backend == "external" and self.external is None:
            raise FieldError("external", "backend 'external' needs an 'external:' block")
        if self.backend == "sglang" and self.sglang is None:
            raise FieldError("sglang", "backend 'sglang' needs an 'sglang:' block")


ProcessorConfig = (
    LLMProcessorConfig | BatchApiProcessorConfig | CustomProcessorConfig | ImageGenProcessorConfig
)

PROCESSOR_TYPES: dict[str, type[Any]] = {
    cls.TYPE: cls
    for cls in (
        LLMProcessorConfig,
        BatchApiProcessorConfig,
        CustomProcessorConfig,
        ImageGenProcessorConfig,
    )
}

__all__ = [
    "PROCESSOR_TYPES",
    "BatchApiProcessorConfig",
    "CustomProcessorConfig",
    "ExternalImageBackend",
    "ImageGenProcessorConfig",
    "LLMProcessorConfig",
    "MessageFormat",
    "ProcessorConfig",
    "SGLangImageBackend",
    "ServerArgs",
    "StructuredOutput",
]
