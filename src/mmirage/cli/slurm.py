"""``mmirage submit``: the unfinished shards as one SLURM array (``execution_params.mode:
slurm``); its job id alone on stdout. Running and following the array is the SLURM executor's
(``mmirage.executors.slurm_run``)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from mmirage.cli.errors import exit_on_errors
from mmirage.cli.options import config_params, config_path, load


def _shard_ids(value: str | None, num_shards: int) -> list[int] | None:
    if value is None:
        return None
    try:
        ids = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of shard ids such as 0,2,3") from None
    bad = [k for k in ids if not 0 <= k < num_shards]
    if bad or not ids:
        raise click.BadParameter(f"shard ids must be in 0..{num_shards - 1}, got {value!r}")
    return ids


@click.command("submit")
@config_params
@click.option(
    "--shard-ids",
    default=None,
    help="Submit only these shards, e.g. 0,2,3 [default: every unfinished shard].",
)
@click.option("--wait", is_flag=True, help="Follow the array to its end (and retry, merge).")
@click.option(
    "--print-script", is_flag=True, help="Print the job script that would run; submit nothing."
)
def submit(
    config: Path | None,
    config_option: Path | None,
    shard_ids: str | None,
    wait: bool,
    print_script: bool,
) -> None:
    """Submit the unfinished shards as one SLURM array and print its job id (mode: slurm).

    JOB_ID=$(mmirage submit c.yaml) works: the job id is alone on stdout. Finished shards are
    never resubmitted.

    CONFIG is the pipeline's YAML file (or give it as --config CONFIG).
    """
    from mmirage.cli.results import results_for
    from mmirage.cli.run import new_run_id
    from mmirage.errors import UserError
    from mmirage.executors.base import RunPlan, RunRequest
    from mmirage.executors.registry import executor_for

    path = config_path(config, config_option)
    with exit_on_errors():
        cfg = load(path)
        ep = cfg.execution_params
        if ep.mode != "slurm":
            raise UserError(
                "submit needs execution_params.mode: slurm (in local mode use 'mmirage run')"
            )
        ids = _shard_ids(shard_ids, cfg.loading_params.num_shards)
        if print_script:
            _print_script(cfg, path, ids)
            return
        executor = executor_for(cfg, path, new_run_id(None), here=False)
        follow = wait or ep.retry or ep.merge
        result = executor.run(RunRequest(ids, RunPlan(retry=ep.retry), follow=follow))
        code = results_for(cfg).finish_run(cfg, path, executor, result, None)
    sys.exit(code)


def _print_script(cfg: object, path: Path, ids: list[int] | None) -> None:
    from mmirage.config.models import MMirageConfig
    from mmirage.executors.forwarding import shard_env
    from mmirage.executors.slurm import workdir_of
    from mmirage.executors.slurm_script import JobSpec, render_job_script

    assert isinstance(cfg, MMirageConfig)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    wanted = ids if ids is not None else range(cfg.loading_params.num_shards)
    spec = JobSpec(
        path.resolve(),
        tuple(wanted),
        workdir_of(cfg),
        log_level=level,
        env=tuple(shard_env(cfg).items()),
    )
    click.echo(render_job_script(cfg.execution_params, spec), nl=False)
