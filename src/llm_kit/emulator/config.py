"""How an emulator behaves: latency, rate limits, injected faults, responder, processes."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

ResponderName = Literal["echo", "local"]
RESPONDERS: tuple[ResponderName, ...] = ("echo", "local")


@dataclass(slots=True)
class Faults:
    """Per-request probabilities (0..1) of each injected failure; they must sum to at most 1.

    ``rate_reset`` closes the connection without an answer, ``rate_hang`` sleeps ``hang_s``
    (longer than any sensible client timeout) before answering, ``rate_insufficient_quota`` is
    OpenAI's non-retryable 429. Injected 429s carry ``retry_after_s``.
    """

    rate_429: float = 0.0
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
    process has its own limiter, fault stream and stats.
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

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.latency_jitter_s < 0:
            raise ValueError("latency_s and latency_jitter_s must not be negative")
        for name in ("rpm", "tpm"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1 (or None for no limit)")
        if self.responder not in RESPONDERS:
            raise ValueError(f"responder must be one of {RESPONDERS}, got {self.responder!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be at least 1, got {self.workers}")

    @classmethod
    def from_options(cls, **options: Any) -> EmulatorConfig:
        """Build from the flat command-line names (``latency``, ``fault_429``, ...).

        Both command lines (``python -m llm_kit.emulator`` and ``mmirage emulate``) go through
        here, so a flag means the same thing in each. ``None`` means "keep the default".
        """
        faults = {
            target: options.pop(flag)
            for flag, target in FAULT_OPTIONS.items()
            if options.get(flag) is not None
        }
        for flag in FAULT_OPTIONS:
            options.pop(flag, None)
        renames = {"latency": "latency_s", "latency_jitter": "latency_jitter_s"}
        kwargs = {renames.get(k, k): v for k, v in options.items() if v is not None}
        return cls(faults=Faults(**faults), **kwargs)

    def to_argv(self) -> list[str]:
        """The ``python -m llm_kit.emulator`` arguments that rebuild this configuration."""
        argv = [
            f"--latency={self.latency_s}",
            f"--latency-jitter={self.latency_jitter_s}",
            f"--responder={self.responder}",
            f"--workers={self.workers}",
        ]
        for flag, value in (("rpm", self.rpm), ("tpm", self.tpm), ("seed", self.seed)):
            if value is not None:
                argv.append(f"--{flag}={value}")
        for flag, target in FAULT_OPTIONS.items():
            argv.append(f"--{flag.replace('_', '-')}={getattr(self.faults, target)}")
        if self.record_times:
            argv.append("--record-times")
        return argv


# Command-line option name → Faults field.
FAULT_OPTIONS: dict[str, str] = {
    "fault_429": "rate_429",
    "fault_500": "rate_500",
    "fault_503": "rate_503",
    "fault_529": "rate_529",
    "fault_reset": "rate_reset",
    "fault_hang": "rate_hang",
    "fault_insufficient_quota": "rate_insufficient_quota",
    "hang_seconds": "hang_s",
    "retry_after": "retry_after_s",
}
