"""How an emulator behaves: latency, rate limits, injected faults, responder, batch jobs."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal, NamedTuple

ResponderName = Literal["echo", "local", "verbatim", "escapes"]
RESPONDERS: tuple[ResponderName, ...] = ("echo", "local", "verbatim", "escapes")
# When JSON answers miss the requested schema on purpose (responder.OffSchemaResponder).
InvalidJson = Literal["never", "first", "always"]
INVALID_JSON: tuple[InvalidJson, ...] = ("never", "first", "always")
# How a missing or wrong key is refused (keys.py): as the provider does, or as a LiteLLM proxy.
KeyRefusal = Literal["provider", "litellm"]
KEY_REFUSALS: tuple[KeyRefusal, ...] = ("provider", "litellm")
# OpenAI-compatible servers whose structured-output forms the OpenAI endpoint takes (dialects.py).
DialectName = Literal[
    "openai", "vllm", "vllm_legacy", "llama_server", "llama_cpp_python", "ollama", "plain"
]
DIALECTS: tuple[DialectName, ...] = (
    "openai",
    "vllm",
    "vllm_legacy",
    "llama_server",
    "llama_cpp_python",
    "ollama",
    "plain",
)


@dataclass(slots=True)
class Faults:
    """Per-request probabilities (0..1) of each injected failure; they must sum to at most 1.

    ``rate_reset`` closes the connection without an answer, ``rate_hang`` sleeps ``hang_s``
    (longer than any sensible client timeout) before answering, ``rate_insufficient_quota`` is
    OpenAI's non-retryable 429. Injected 429s carry ``retry_after_s``. ``rate_429_budget_left``
    is a sporadic 429 that is no spent budget: it carries the family's rate-limit headers, which
    show budget left (when ``rpm``/``tpm`` are set; none otherwise, and Gemini names no spent
    quota in its body).
    """

    rate_429: float = 0.0
    rate_429_budget_left: float = 0.0
    rate_500: float = 0.0
    rate_503: float = 0.0
    rate_529: float = 0.0
    rate_reset: float = 0.0
    rate_hang: float = 0.0
    rate_insufficient_quota: float = 0.0
    hang_s: float = 600.0
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.startswith("rate_") and not 0.0 <= value <= 1.0:
                raise ValueError(f"Faults.{f.name} must be between 0 and 1, got {value}")
        if self.total_rate > 1.0 + 1e-9:
            raise ValueError(f"the fault rates add up to {self.total_rate:.3f}, more than 1")
        if self.hang_s < 0 or self.retry_after_s < 0:
            raise ValueError("Faults.hang_s and Faults.retry_after_s must not be negative")

    @property
    def total_rate(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self) if f.name.startswith("rate_"))


@dataclass(slots=True)
class EmulatorConfig:
    """Everything a running emulator needs; picklable so that worker processes can get it.

    ``rpm``/``tpm`` give each provider family (OpenAI, Anthropic, Gemini) its own token
    buckets. ``record_times`` keeps the wall-clock time of every request admitted past the rate
    limiter in the stats (for benchmarks that check pacing). With ``workers > 1`` each worker
    process has its own limiter, fault stream, stats and batch jobs (so batch clients, whose
    polls may reach any worker, need ``workers = 1``).

    Batch jobs (all three providers): ``batch_delay_s`` is how long a job takes from creation
    to its end (0: done at the first poll); ``batch_failure_rate`` and ``batch_expire_rate`` are
    the shares of jobs that fail as a whole or expire (``batch_expire_done_fraction`` of an
    expiring job's requests still succeed); ``batch_item_error_rate`` is the share of requests
    that fail one by one. ``batch_max_requests``/``batch_max_bytes`` replace every provider's
    own per-batch limits, so that tests can check that a client splits its jobs.
    ``batch_create_delay_s`` holds every batch creation's answer back that long *after* the
    job exists, as a slow provider does: a client stopped in between has paid for a batch it
    never heard of (the window that orphan adoption closes). ``batch_damaged_downloads`` is how
    many result-file downloads, from the first, are served damaged (empty, cut off, invalid
    UTF-8, in turn; see ``damaged_downloads``).

    ``dialect`` makes the OpenAI endpoint take only the structured-output forms of one
    OpenAI-compatible server (``openai``, ``vllm``, ``vllm_legacy``, ``llama_server``,
    ``llama_cpp_python``, ``ollama``, ``plain``: none) and refuse or ignore the others as that
    server does (dialects.py); only ``openai`` serves the files and batches routes (the others
    answer 404 there, as those servers do). ``model_dialects`` gives some models a dialect of
    their own, as a gateway (LiteLLM) that routes each model to its own server.

    ``invalid_json`` makes JSON answers miss the requested schema (a JSON array instead of
    the object): ``always`` (an answer that never validates), ``first`` (only when the
    conversation holds no assistant turn yet: a re-ask that quotes the bad answer succeeds) or
    ``never``. ``record_requests`` keeps every live request (its body, and the conversation
    as the responder saw it) for ``/_emulator/requests``: for tests that check what a client
    sent; off by default, since a benchmark sends millions.

    ``api_key`` is the one key the OpenAI endpoint accepts (``None``: any non-empty one), as a
    keyed server or gateway does; ``refuse_keys_as`` says how a missing or other key is
    refused: ``provider`` (OpenAI's 401) or ``litellm`` (a LiteLLM proxy without a database:
    HTTP 500 in plain text without a key, HTTP 400 "No connected db." with a wrong one).
    """

    latency_s: float = 0.0
    latency_jitter_s: float = 0.0
    rpm: int | None = None
    tpm: int | None = None
    faults: Faults = field(default_factory=Faults)
    responder: ResponderName = "echo"
    seed: int | None = None
    workers: int = 1
    record_times: bool = False
    batch_delay_s: float = 0.0
    batch_failure_rate: float = 0.0
    batch_expire_rate: float = 0.0
    batch_expire_done_fraction: float = 0.5
    batch_item_error_rate: float = 0.0
    batch_max_requests: int | None = None
    batch_max_bytes: int | None = None
    batch_create_delay_s: float = 0.0
    batch_damaged_downloads: int = 0
    dialect: DialectName = "openai"
    model_dialects: tuple[tuple[str, DialectName], ...] = ()
    invalid_json: InvalidJson = "never"
    record_requests: bool = False
    api_key: str | None = None
    refuse_keys_as: KeyRefusal = "provider"

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.latency_jitter_s < 0:
            raise ValueError("latency_s and latency_jitter_s must not be negative")
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None for no limit)")
        if self.responder not in RESPONDERS:
            raise ValueError(f"responder must be one of {RESPONDERS}, got {self.responder!r}")
        for dialect in (self.dialect, *(d for _, d in self.model_dialects)):
            if dialect not in DIALECTS:
                raise ValueError(f"dialect must be one of {DIALECTS}, got {dialect!r}")
        if self.invalid_json not in INVALID_JSON:
            raise ValueError(
                f"invalid_json must be one of {INVALID_JSON}, got {self.invalid_json!r}"
            )
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")
        if self.refuse_keys_as not in KEY_REFUSALS:
            raise ValueError(
                f"refuse_keys_as must be one of {KEY_REFUSALS}, got {self.refuse_keys_as!r}"
            )
        self._check_batch()

    def _check_batch(self) -> None:
        for name in ("batch_delay_s", "batch_create_delay_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        for name in (
            "batch_failure_rate",
            "batch_expire_rate",
            "batch_expire_done_fraction",
            "batch_item_error_rate",
        ):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        if self.batch_failure_rate + self.batch_expire_rate > 1.0 + 1e-9:
            raise ValueError("batch_failure_rate and batch_expire_rate add up to more than 1")
        if self.batch_damaged_downloads < 0:
            raise ValueError("batch_damaged_downloads must not be negative")
        for name in ("batch_max_requests", "batch_max_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None for the provider's own)")

    @classmethod
    def from_options(cls, **options: Any) -> EmulatorConfig:
        """Build from the flat command-line names (``latency``, ``fault_429``, ...).

        Both command lines (``python -m provider_emulator`` and ``mmirage emulate``) go through
        here, so a flag means the same thing in each. ``None`` means "keep the default".
        """
        faults = {
            target: options.pop(flag)
            for flag, target in FAULT_OPTIONS.items()
            if options.get(flag) is not None
        }
        for flag in FAULT_OPTIONS:
            options.pop(flag, None)
        if pairs := options.pop("model_dialect", None):  # MODEL=DIALECT, the last = splits
            options["model_dialects"] = tuple(tuple(p.rsplit("=", 1)) for p in pairs)
        renames = {"latency": "latency_s", "latency_jitter": "latency_jitter_s"}
        kwargs = {renames.get(k, k): v for k, v in options.items() if v is not None}
        return cls(faults=Faults(**faults), **kwargs)

    def to_argv(self) -> list[str]:
        """The ``python -m provider_emulator`` arguments that rebuild this configuration."""
        argv = [
            f"--latency={self.latency_s}",
            f"--latency-jitter={self.latency_jitter_s}",
            f"--responder={self.responder}",
            f"--workers={self.workers}",
            f"--dialect={self.dialect}",
            *(f"--model-dialect={model}={dialect}" for model, dialect in self.model_dialects),
        ]
        for flag, value in (("rpm", self.rpm), ("tpm", self.tpm), ("seed", self.seed)):
            if value is not None:
                argv.append(f"--{flag}={value}")
        for flag, target in FAULT_OPTIONS.items():
            argv.append(f"--{flag.replace('_', '-')}={getattr(self.faults, target)}")
        if self.record_times:
            argv.append("--record-times")
        if self.invalid_json != "never":
            argv.append(f"--invalid-json={self.invalid_json}")
        if self.record_requests:
            argv.append("--record-requests")
        if self.api_key is not None:
            argv.append(f"--api-key={self.api_key}")
        if self.refuse_keys_as != "provider":
            argv.append(f"--refuse-keys-as={self.refuse_keys_as}")
        for option in BATCH_OPTIONS:
            value = getattr(self, option.field)
            if value is not None:
                argv.append(f"{option.flag}={value}")
        return argv


# Command-line option name → Faults field.
FAULT_OPTIONS: dict[str, str] = {
    "fault_429": "rate_429",
    "fault_429_budget_left": "rate_429_budget_left",
    "fault_500": "rate_500",
    "fault_503": "rate_503",
    "fault_529": "rate_529",
    "fault_reset": "rate_reset",
    "fault_hang": "rate_hang",
    "fault_insufficient_quota": "rate_insufficient_quota",
    "hang_seconds": "hang_s",
    "retry_after": "retry_after_s",
}


class BatchOption(NamedTuple):
    """One batch setting as a command-line flag: ``python -m provider_emulator`` and ``to_argv``
    are built from these; ``mmirage emulate`` declares the same flags (kept import-free)."""

    field: str  # the EmulatorConfig field, which is also the option's keyword
    flag: str
    kind: type[float] | type[int]
    help: str
    alias: str | None = None


BATCH_OPTIONS: tuple[BatchOption, ...] = (
    BatchOption(
        "batch_delay_s",
        "--batch-delay-s",
        float,
        "seconds a batch job takes from creation to its end (default 0: done at the first poll)",
        alias="--batch-delay",
    ),
    BatchOption("batch_failure_rate", "--batch-failure-rate", float, "share of batches that fail"),
    BatchOption("batch_expire_rate", "--batch-expire-rate", float, "share of batches that expire"),
    BatchOption(
        "batch_expire_done_fraction",
        "--batch-expire-done-fraction",
        float,
        "share of an expiring batch's requests that still succeed (default 0.5)",
    ),
    BatchOption(
        "batch_item_error_rate",
        "--batch-item-error-rate",
        float,
        "share of batch requests that fail one by one",
    ),
    BatchOption(
        "batch_max_requests",
        "--batch-max-requests",
        int,
        "requests per batch, for every provider (default: each provider's own limit)",
    ),
    BatchOption(
        "batch_max_bytes",
        "--batch-max-bytes",
        int,
        "bytes per batch, for every provider (default: each provider's own limit)",
    ),
    BatchOption(
        "batch_create_delay_s",
        "--batch-create-delay-s",
        float,
        "seconds each batch creation answers late, after the job exists (default 0)",
    ),
    BatchOption(
        "batch_damaged_downloads",
        "--batch-damaged-downloads",
        int,
        "the first N result-file downloads are served damaged: empty, cut off, invalid UTF-8",
    ),
)
