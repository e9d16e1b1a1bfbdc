"""What a pipeline's results are, chosen once per command: the shards' published files, or the
provider batches of a ``batch_api`` processor (then check, merge and retry follow the batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from mmirage.cli.errors import os_failure
from mmirage.errors import UserError

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.executors.base import Executor
    from mmirage.executors.outcome import RunResult
    from mmirage.rundir import RunDir


@dataclass(frozen=True)
class MergeRequest:
    output_root: Path | None
    allow_partial: bool
    fmt: str
    output_path: Path | None  # batch_api: the one ordered JSONL file
    metadata_paths: tuple[str, ...]
    wait: bool


@dataclass(frozen=True)
class CheckRequest:
    metadata_paths: tuple[str, ...]
    wait: bool
    poll_interval: float | None
    retry_failed: bool
    yes: bool


class Results(Protocol):
    def check(self, cfg: MMirageConfig, path: Path, executor: Executor, r: CheckRequest) -> int:
        """Report the state of the results; the exit code."""

    def merge(self, cfg: MMirageConfig, run_dir: RunDir, request: MergeRequest) -> int:
        """Bring the results into one dataset; the exit code."""

    def finish_run(
        self,
        cfg: MMirageConfig,
        path: Path,
        executor: Executor,
        result: RunResult,
        wait_output: Path | None,
    ) -> int:
        """After ``run``: its report, then what follows when every shard finished."""

    def finish_retry(self, cfg: MMirageConfig, executor: Executor, only_retryable: bool) -> int:
        """After the shards of ``retry`` all succeeded."""


class ShardResults:
    def check(self, cfg: MMirageConfig, path: Path, executor: Executor, r: CheckRequest) -> int:
        if r.metadata_paths or r.wait or r.poll_interval is not None:
            raise UserError(
                "--metadata-path, --wait and --poll-interval apply to batch_api configs only"
            )
        return executor.check(retry_failed=r.retry_failed, yes=r.yes)

    def merge(self, cfg: MMirageConfig, run_dir: RunDir, request: MergeRequest) -> int:
        from mmirage.cli.merge_report import report
        from mmirage.core.merge.shards import merge_config

        if request.output_path is not None or request.metadata_paths or request.wait:
            raise UserError(
                "--output-path, --metadata-path and --wait apply to batch_api configs only"
            )
        try:
            results = merge_config(
                cfg,
                run_dir,
                output_root=request.output_root,
                fmt=request.fmt.lower(),  # type: ignore[arg-type]  # click.Choice checked it
                allow_partial=request.allow_partial,
            )
        except OSError as exc:
            os_failure(exc, "--output-root" if request.output_root else "merge output")
        report(results)
        return 0

    def finish_run(
        self,
        cfg: MMirageConfig,
        path: Path,
        executor: Executor,
        result: RunResult,
        wait_output: Path | None,
    ) -> int:
        from mmirage.cli.merge_report import merge_after_run

        result.conclude()
        whole = len(result.shards) == cfg.loading_params.num_shards
        if result.finished and whole and cfg.execution_params.merge:
            # The whole pipeline ran: merge it, as `mmirage merge CONFIG` would.
            merge_after_run(cfg, executor.run_dir)
        return 0

    def finish_retry(self, cfg: MMirageConfig, executor: Executor, only_retryable: bool) -> int:
        return 0


class BatchResults:
    def check(self, cfg: MMirageConfig, path: Path, executor: Executor, r: CheckRequest) -> int:
        from mmirage.cli.batch_mode import batch_check

        run_dir = executor.run_dir
        return batch_check(cfg, path, r.metadata_paths, r.wait, r.poll_interval, run_dir=run_dir)

    def merge(self, cfg: MMirageConfig, run_dir: RunDir, request: MergeRequest) -> int:
        from mmirage.cli.batch_mode import batch_merge

        if request.output_path is None:
            raise UserError("this config has a batch_api processor: give --output-path FILE.jsonl")
        paths, wait = request.metadata_paths, request.wait
        return batch_merge(cfg, request.output_path, paths, wait, run_dir=run_dir)

    def finish_run(
        self,
        cfg: MMirageConfig,
        path: Path,
        executor: Executor,
        result: RunResult,
        wait_output: Path | None,
    ) -> int:
        from mmirage.cli.batch_mode import batch_check, batch_merge

        codes = [0]
        if result.finished and wait_output is not None:
            # Submitted: wait and merge whatever happened to the rows and batches (merge keeps
            # every row, failed ones with their reason); the run's report comes after.
            run_dir = executor.run_dir
            codes += [
                batch_check(cfg, path, wait=True, run_dir=run_dir),
                batch_merge(cfg, wait_output, wait=True, run_dir=run_dir),
            ]
        result.conclude()
        return max(codes)

    def finish_retry(self, cfg: MMirageConfig, executor: Executor, only_retryable: bool) -> int:
        from mmirage.cli.batch_mode import batch_retry

        return batch_retry(cfg, only_retryable, run_dir=executor.run_dir)


RESULTS: dict[bool, Results] = {False: ShardResults(), True: BatchResults()}


def results_for(cfg: MMirageConfig) -> Results:
    """The one place that tells batch_api pipelines from the others."""
    return RESULTS[cfg.uses_batch_api]
