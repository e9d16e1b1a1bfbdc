"""``mmirage run``: run the pipeline's shards where ``execution_params.mode`` says.

Exit codes: 0 every shard succeeded; 1 some work failed (a shard failed, ran out of retries, or
could not run because another process holds it or it holds another configuration's results:
the other shards still run, and the problem is reported at the end); 2 a problem the user must
fix before anything can run (configuration, data path, a directory that cannot be written, a
missing API key). Heavy modules are imported inside the commands so ``mmirage --help`` stays
fast.

With ``execution_params.local_parallel_shards`` above 1, the shards run that many at a time as
child processes (``mmirage.executors.parallel``); in slurm mode as SLURM array tasks; in ray
mode as Ray tasks (``mmirage.executors.ray_run``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from mmirage.cli.errors import exit_on_errors
from mmirage.cli.options import config_params, config_path, load

# Hidden: a parent run gives its children its own id (their batch receipts then share it).
RUN_ID_OPTION = click.option("--run-id", default=None, hidden=True, help="This run's id.")


def new_run_id(given: str | None) -> str:
    from mmirage.core.shard.runner import new_run_id as draw

    return given or draw()


@click.command("run")
@config_params
@click.option(
    "--shard-id",
    type=click.IntRange(min=0),
    default=None,
    help="Run only this shard [default: loading_params.shard_id, else every shard].",
)
@click.option(
    "--force-retry",
    is_flag=True,
    help="Retry shards that did not succeed, even when out of retries, and the rows that failed "
    "for a retryable reason (finished rows are kept).",
)
@click.option(
    "--recompute",
    is_flag=True,
    help="Discard the shards' results and compute them again from the stored answers (pays "
    "only for requests never answered; batch_api outputs are submitted again).",
)
@click.option(
    "--fresh",
    is_flag=True,
    help="Ask every request again instead of taking stored answers (new samples; pays for "
    "every row again); implies --recompute.",
)
@click.option("--stats", is_flag=True, help="Print the shards' statistics as JSON on stdout.")
@click.option(
    "--export-prompts",
    "export_prompts",
    default=None,
    metavar="PATH",
    help="batch_api dry run: write every request to PATH (X.jsonl → X.<run_id>.jsonl, any "
    "other path is a directory) instead of submitting; no key needed.",
)
@click.option(
    "--wait",
    is_flag=True,
    help="batch_api: after submitting, wait for the batches and merge into --output-path; "
    "mode: slurm: follow the array to its end (then the batches, with --output-path).",
)
@click.option(
    "--output-path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --wait: the merged JSONL file.",
)
@RUN_ID_OPTION
def run(
    config: Path | None,
    config_option: Path | None,
    shard_id: int | None,
    force_retry: bool,
    recompute: bool,
    fresh: bool,
    stats: bool,
    export_prompts: str | None,
    wait: bool,
    output_path: Path | None,
    run_id: str | None,
) -> None:
    """Run the pipeline's shards (here, or as one SLURM array in mode: slurm); finished ones
    are skipped.

    Without --shard-id: loading_params.shard_id if the file sets one, else every shard,
    execution_params.local_parallel_shards at a time. An interrupted shard resumes at its last
    checkpoint. With execution_params.retry (or --force-retry) a failed shard is retried up to
    max_retries times. In mode: slurm the unfinished shards are submitted and the job id is
    printed alone on stdout; --wait (or retry/merge: true) follows the array to its end. In
    mode: ray each shard runs as a task on the Ray cluster, and the command waits for them all.

    CONFIG is the pipeline's YAML file (or give it as --config CONFIG).
    """
    from mmirage.cli.results import results_for
    from mmirage.errors import UserError
    from mmirage.executors.base import RunPlan, RunRequest
    from mmirage.executors.registry import executor_for

    path = config_path(config, config_option)
    with exit_on_errors():
        cfg = load(path)
        lp, ep = cfg.loading_params, cfg.execution_params
        if shard_id is not None and shard_id >= lp.num_shards:
            raise UserError(f"--shard-id {shard_id} is out of range: num_shards is {lp.num_shards}")
        here = shard_id is not None or export_prompts is not None
        executor = executor_for(cfg, path, new_run_id(run_id), here=here)
        batch = cfg.uses_batch_api
        if ep.mode == "slurm" and not here:
            if wait and batch and output_path is None:
                raise UserError("--wait with a batch_api processor needs --output-path FILE.jsonl")
        elif wait and not batch:
            raise UserError("--wait follows provider batches: this config has no batch_api output")
        elif wait and output_path is None:
            raise UserError("--wait needs --output-path FILE.jsonl, where the results are merged")
        plan = RunPlan(
            retry=ep.retry or force_retry,
            force_retry=force_retry,
            recompute=recompute or fresh,
            fresh=fresh,
            retry_rows=force_retry,
            export_prompts=export_prompts,
        )
        follow = wait or ep.retry or ep.merge or force_retry
        shards = [shard_id] if shard_id is not None else None
        result = executor.run(RunRequest(shards, plan, follow=follow, stats=stats))
        wait_output = output_path if wait else None
        code = results_for(cfg).finish_run(cfg, path, executor, result, wait_output)
    sys.exit(code)
