"""``mmirage retry`` and ``mmirage check``: finish what did not succeed, report the state."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from mmirage.cli.errors import exit_on_errors
from mmirage.cli.options import config_params, config_path, load, metadata_paths_option
from mmirage.cli.run import RUN_ID_OPTION, new_run_id


@click.command("retry")
@config_params
@click.option(
    "--shard-id",
    type=click.IntRange(min=0),
    default=None,
    help="Retry only this shard [default: every shard that did not succeed].",
)
@click.option("--stats", is_flag=True, help="Add the retried shards' statistics to the JSON.")
@click.option("-y", "--yes", is_flag=True, help="slurm mode: resubmit without asking.")
@click.option(
    "--only-retryable",
    is_flag=True,
    help="batch_api: resubmit only requests whose error the provider marks retryable.",
)
@RUN_ID_OPTION
def retry(
    config: Path | None,
    config_option: Path | None,
    shard_id: int | None,
    stats: bool,
    yes: bool,
    only_retryable: bool,
    run_id: str | None,
) -> None:
    """Rerun the shards that did not succeed (failed, dead while running, or never run), and
    in finished shards the rows that failed for a retryable reason (only their failed outputs
    are requested again).

    Each gets at most execution_params.max_retries retries in all (status.json counts its
    attempts); succeeded shards are skipped. Prints the summary JSON; exits 0 only when every
    shard has succeeded. With a batch_api processor, then resubmits the requests that failed,
    expired, were canceled or are missing from ended batches (a later merge takes them).

    CONFIG is the pipeline's YAML file (or give it as --config CONFIG).
    """
    from mmirage.cli.results import results_for
    from mmirage.errors import UserError
    from mmirage.executors.registry import executor_for

    path = config_path(config, config_option)
    with exit_on_errors():
        cfg = load(path)
        n = cfg.loading_params.num_shards
        if shard_id is not None and shard_id >= n:
            raise UserError(f"--shard-id {shard_id} is out of range: num_shards is {n}")
        here = shard_id is not None
        executor = executor_for(cfg, path, new_run_id(run_id), here=here)
        shards = [shard_id] if shard_id is not None else None
        code = executor.retry(shards, stats=stats, yes=yes)
        if code == 0:
            code = results_for(cfg).finish_retry(cfg, executor, only_retryable)
    sys.exit(code)


@click.command("check")
@config_params
@metadata_paths_option("check")
@click.option("--wait", is_flag=True, help="batch_api configs: poll until every batch has ended.")
@click.option(
    "--retry", "retry_failed", is_flag=True, help="slurm mode: resubmit failed and dead shards."
)
@click.option("-y", "--yes", is_flag=True, help="slurm mode: with --retry, do not ask.")
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0.1),
    default=None,
    help="Seconds between polls with --wait [default: execution_params.poll_interval_seconds].",
)
def check(
    config: Path | None,
    config_option: Path | None,
    metadata_paths: tuple[str, ...],
    wait: bool,
    retry_failed: bool,
    yes: bool,
    poll_interval: float | None,
) -> None:
    """Show every shard's state as a table, then a summary; exit 0 only when all succeeded.

    ATTEMPTS is attempts made / allowed (1 + max_retries); a running shard whose heartbeat is
    old, or whose process is gone, is "stale" and will be rerun by 'mmirage retry'; a finished
    shard with rows that failed for a retryable reason is "partial" (exit 1): 'mmirage retry'
    computes just those rows again. Rows that failed for good are reported, exit 0.

    In slurm mode each shard's latest SLURM task too (job, state, elapsed, log; one squeue
    call), a task that died without recording it shown as such; --retry [-y] resubmits the
    failed and dead shards as one array.

    With a batch_api processor: the provider status of every submitted batch instead, then
    the summary per provider; exit 1 only when a batch failed at the provider.

    CONFIG is the pipeline's YAML file (or give it as --config CONFIG).
    """
    from mmirage.cli.results import CheckRequest, results_for
    from mmirage.executors.registry import executor_for

    path = config_path(config, config_option)
    with exit_on_errors():
        cfg = load(path)
        # Without SLURM here (say, on a laptop holding the state folder) the plain table.
        here = not (retry_failed or shutil.which("sbatch"))
        executor = executor_for(cfg, path, new_run_id(None), here=here)
        request = CheckRequest(metadata_paths, wait, poll_interval, retry_failed, yes)
        code = results_for(cfg).check(cfg, path, executor, request)
    sys.exit(code)
