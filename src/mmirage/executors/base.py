"""The executor interface: where a pipeline's shards run (here, or as SLURM array tasks).

The executor decides where shards run and follows them; the shard runner
(``mmirage.core.shard``) decides how one shard runs. The CLI picks the executor for
``execution_params.mode`` from ``EXECUTORS`` and calls the same three methods in every mode.
An executor prints its progress on stderr and raises ``UserError``/``WorkFailed`` for the CLI's
error handler; it returns the command's exit code otherwise.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.executors.outcome import RunResult


@dataclass(frozen=True)
class RunPlan:
    """How the selected shards run. ``retry``: retry failures within the retry budget
    (``max_retries`` retries after the first attempt, counted by status.json ``attempts``);
    ``force_retry``: a new budget even when it is spent; ``recompute``: compute the shards
    again from the stored answers; ``fresh``: ask every request again (new samples);
    ``retry_rows``: compute again the published rows that failed for a retryable reason."""

    retry: bool
    force_retry: bool = False
    recompute: bool = False
    fresh: bool = False
    retry_rows: bool = False
    export_prompts: str | None = None  # dry run: batch_api requests go to this path

    def flags(self) -> list[str]:
        """The ``mmirage run`` flags a shard run elsewhere (a child, a SLURM task) gets."""
        chosen = (
            ("--force-retry", self.force_retry),
            ("--recompute", self.recompute),
            ("--fresh", self.fresh),
        )
        return [flag for flag, on in chosen if on]


@dataclass(frozen=True)
class RunRequest:
    """One ``mmirage run``: which shards (``None``: those the config selects) and how."""

    shards: list[int] | None
    plan: RunPlan
    follow: bool = False  # an executor that only submits waits for the shards' end
    stats: bool = False  # print the shards' statistics as JSON on stdout


class Executor(ABC):
    """Runs the shards of one pipeline: ``config_path`` is what a shard process is given,
    ``run_id`` names this invocation in every shard it starts (batch receipts share it)."""

    def __init__(self, cfg: MMirageConfig, config_path: Path, run_id: str) -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.run_id = run_id
        self.run_dir = RunDir.of(cfg)  # once for the whole command

    @abstractmethod
    def run(self, request: RunRequest) -> RunResult:
        """Run (or submit, and with ``follow`` see through) the shards."""

    @abstractmethod
    def retry(self, shards: list[int] | None, *, stats: bool, yes: bool) -> int:
        """Run again the shards (``None``: all) that did not succeed, then print the summary
        JSON on stdout; 0 when every shard has succeeded (or was resubmitted)."""

    @abstractmethod
    def check(self, *, retry_failed: bool, yes: bool) -> int:
        """Print every shard's state and a summary: 0 only when all have succeeded."""


def summary(states: list[str]) -> dict[str, int]:
    """The original's retry/check summary: total, successful, running, failed (everything
    else but exhausted), max_retries_exceeded."""
    from mmirage.core.shard.state import EXHAUSTED, RUNNING, SUCCESS

    counts = {s: states.count(s) for s in (SUCCESS, RUNNING, EXHAUSTED)}
    return {
        "total": len(states),
        "successful": counts[SUCCESS],
        "running": counts[RUNNING],
        "failed": len(states) - sum(counts.values()),
        "max_retries_exceeded": counts[EXHAUSTED],
    }
