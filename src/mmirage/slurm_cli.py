"""``execution_params.mode: slurm``: ``run`` and ``submit`` submit the unfinished shards as one
``sbatch`` array and print its job id alone on stdout; ``--wait`` (or ``retry: true`` /
``merge: true``) follows the array, resubmits failed shards up to ``max_retries`` times and
merges; ``check`` joins each shard's status with SLURM's view of its task; ``retry`` and
``check --retry`` resubmit the failed and dead shards as one array.

Exit codes as everywhere: 0 done, 1 the work failed (or SLURM kept failing to answer), 2 the user
must fix something (no sbatch, sbatch refused the job, a bad config).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mmirage.cli_support import (
    config_params,
    config_path,
    fail,
    has_batch_api,
    load,
    print_table,
    user_errors_exit_2,
)

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.executors.slurm import ShardView, Submission
    from mmirage.executors.slurm_client import SlurmClient, TaskInfo

NO_SBATCH = "mode: slurm needs SLURM's sbatch on PATH (or use mode: local)"


def client_or_exit() -> SlurmClient:
    from mmirage.executors.slurm_client import SlurmClient

    if not SlurmClient.installed():
        fail(NO_SBATCH, 2)
    return SlurmClient()


def _log_level() -> str:
    return logging.getLevelName(logging.getLogger().getEffectiveLevel())


def submit_shards(
    cfg: MMirageConfig,
    path: Path,
    shard_ids: Sequence[int],
    client: SlurmClient,
    *,
    id_on_stdout: bool = True,
    command: str = "run",
) -> Submission:
    """One sbatch array for ``shard_ids``; its job id alone on stdout (``JOB=$(mmirage run
    c.yaml)``), the rest on stderr."""
    from mmirage.executors.slurm import submit
    from mmirage.executors.slurm_client import SlurmRejectedError, SlurmUnavailableError

    try:
        record = submit(cfg, path, shard_ids, client, log_level=_log_level(), command=command)
    except SlurmRejectedError as exc:
        fail(str(exc), 2)
    except SlurmUnavailableError as exc:
        fail(str(exc), 2)
    if id_on_stdout:
        click.echo(record.job_id)
    click.echo(
        f"submitted SLURM job {record.job_id}: shard(s) {list(record.shards)}; "
        f"job script {record.script}",
        err=True,
    )
    return record


def views_or_exit(cfg: MMirageConfig, path: Path, client: SlurmClient) -> list[ShardView]:
    from mmirage.executors.slurm import shard_views
    from mmirage.executors.slurm_client import SlurmUnavailableError

    try:
        return shard_views(cfg, path, client)
    except SlurmUnavailableError as exc:
        fail(str(exc), 1)


def run_on_slurm(
    cfg: MMirageConfig,
    path: Path,
    *,
    shard_ids: Sequence[int] | None = None,
    follow: bool = False,
    batch_output: Path | None = None,
) -> int:
    """Submit every unfinished shard (of ``shard_ids``); with ``follow`` (``--wait``,
    ``retry: true`` or ``merge: true``) see the pipeline through. The exit code."""
    from mmirage.executors.slurm import unfinished

    client = client_or_exit()
    views = views_or_exit(cfg, path, client)
    wanted = set(range(cfg.loading_params.num_shards) if shard_ids is None else shard_ids)
    todo = [k for k in unfinished(views) if k in wanted]
    skipped = sorted(wanted - set(todo))
    if skipped:
        click.echo(f"not submitted (succeeded, queued or out of retries): {skipped}", err=True)
    jobs = [submit_shards(cfg, path, todo, client).job_id] if todo else []
    if not follow:
        return 0
    code = follow_pipeline(cfg, path, client, sorted(wanted), jobs)
    if code == 0 and batch_output is not None:
        # The tasks submitted their batches: wait for them and merge, as local `run --wait`.
        from mmirage.batch_cli import batch_check, batch_merge

        return max(batch_check(cfg, path, wait=True), batch_merge(cfg, batch_output, wait=True))
    return code


def _queued_jobs(views: Sequence[ShardView], wanted: Sequence[int]) -> list[str]:
    return sorted(
        {v.task.job_id for v in views if v.task and v.task.active and v.shard_id in wanted}
    )


def follow_pipeline(
    cfg: MMirageConfig, path: Path, client: SlurmClient, wanted: list[int], jobs: list[str]
) -> int:
    """Wait for the shards' tasks, resubmit the failed ones (``retry``), then merge."""
    from mmirage.executors.slurm import wait_for
    from mmirage.executors.slurm_client import SlurmUnavailableError

    ep = cfg.execution_params
    views = views_or_exit(cfg, path, client)
    jobs = sorted(set(jobs) | set(_queued_jobs(views, wanted)))
    resubmits = 0
    while True:
        try:
            wait_for(
                jobs,
                client,
                poll_s=ep.poll_interval_seconds,
                settle_s=ep.settle_time_seconds,
                on_poll=_Progress(len(wanted)),
            )
        except SlurmUnavailableError as exc:
            fail(str(exc), 1)
        views = views_or_exit(cfg, path, client)
        bad = [v for v in views if v.shard_id in wanted and v.state != "success"]
        again = [v.shard_id for v in bad if v.retryable and v.state != "exhausted"]
        if not bad or not ep.retry or not again or resubmits >= ep.max_retries:
            break
        resubmits += 1
        click.echo(f"resubmitting shard(s) {again} (round {resubmits}/{ep.max_retries})", err=True)
        jobs = [submit_shards(cfg, path, again, client, command="retry").job_id]
    if bad:
        for view in bad:
            click.echo(f"shard {view.shard_id}: {describe(view)}", err=True)
        click.echo(f"error: {len(bad)} of {len(wanted)} shard(s) did not succeed", err=True)
        return 1
    if ep.merge and len(wanted) == cfg.loading_params.num_shards and not has_batch_api(cfg):
        from mmirage.merge_cli import merge_after_run

        merge_after_run(cfg)
    return 0


class _Progress:
    """One stderr line each time the array's counts change."""

    def __init__(self, total: int) -> None:
        self.total, self.last = total, ""

    def __call__(self, tasks: dict[tuple[str, int], TaskInfo]) -> None:
        counts: dict[str, int] = {}
        for task in tasks.values():
            counts[task.state] = counts.get(task.state, 0) + 1
        line = ", ".join(f"{n} {state.lower()}" for state, n in sorted(counts.items()))
        if line and line != self.last:
            self.last = line
            click.echo(f"slurm: {line}", err=True)


def describe(view: ShardView) -> str:
    """A shard's end in a few words: our state, SLURM's, and where its log is."""
    error = " ".join(str((view.status or {}).get("error") or "").split())
    parts = [view.state]
    if view.task is not None:
        parts.append(f"SLURM {view.task.state} (job {view.task.job_id}_{view.task.task})")
    if error:
        parts.append(error if len(error) <= 160 else error[:159] + "…")
    if view.log:
        parts.append(f"log {view.log}")
    return "; ".join(parts)


def check_table(cfg: MMirageConfig, path: Path) -> tuple[list[list[str]], list[ShardView]]:
    """The rows of ``check``'s table in slurm mode (one squeue call for every task)."""
    client = client_or_exit()
    views = views_or_exit(cfg, path, client)
    budget = cfg.execution_params.max_retries + 1
    lines = [["SHARD", "STATUS", "ATTEMPTS", "ROWS", "FAILED", "JOB", "SLURM", "ELAPSED", "LOG"]]
    for v in views:
        status = v.status or {}
        task = v.task
        lines.append(
            [
                str(v.shard_id),
                v.state,
                f"{int(status.get('attempts') or 0)}/{budget}",
                str(int(status.get("rows_done") or 0)),
                str(int(status.get("rows_failed") or 0)),
                f"{task.job_id}_{task.task}" if task else "-",
                task.state if task else "-",
                (task.elapsed or "-") if task else "-",
                v.log or "-",
            ]
        )
    return lines, views


def resubmit_failed(cfg: MMirageConfig, path: Path, yes: bool, *, id_on_stdout: bool) -> int:
    """``check --retry`` / ``retry``: the failed and dead shards as one array, after asking."""
    from mmirage.executors.slurm import unfinished

    client = client_or_exit()
    todo = unfinished(views_or_exit(cfg, path, client))
    if not todo:
        click.echo("no shard to resubmit", err=True)
        return 0
    question = f"Retry {len(todo)} shard(s)? (y/N) "
    if not yes:
        if not sys.stdin.isatty():
            click.echo(f"{question}— not a terminal: pass -y to resubmit", err=True)
            return 1
        if not click.confirm(question.removesuffix(" (y/N) "), default=False):
            return 1
    submit_shards(cfg, path, todo, client, id_on_stdout=id_on_stdout, command="retry")
    return 0


def summary(views: Sequence[ShardView]) -> dict[str, int]:
    """The original's summary keys: total, successful, running, failed, max_retries_exceeded."""
    states = [v.state for v in views]
    counts = {s: states.count(s) for s in ("success", "running", "exhausted")}
    return {
        "total": len(states),
        "successful": counts["success"],
        "running": counts["running"],
        "failed": len(states) - sum(counts.values()),
        "max_retries_exceeded": counts["exhausted"],
    }


def retry_on_slurm(cfg: MMirageConfig, path: Path, yes: bool, only_retryable: bool) -> int:
    """``mmirage retry`` in slurm mode: resubmit, then the summary JSON on stdout (and, for
    batch_api, resubmit the requests that failed at the provider, as in local mode)."""
    import json

    code = resubmit_failed(cfg, path, yes, id_on_stdout=False)
    click.echo(json.dumps(summary(views_or_exit(cfg, path, client_or_exit())), indent=2))
    if code == 0 and has_batch_api(cfg):
        from mmirage.batch_cli import batch_retry

        return batch_retry(cfg, only_retryable)
    return code


def check_on_slurm(cfg: MMirageConfig, path: Path, retry: bool, yes: bool) -> int:
    """``mmirage check`` in slurm mode: the joined table, a summary, and ``--retry``."""
    lines, views = check_table(cfg, path)
    print_table(lines)
    counts = summary(views)
    # The same summary line as in local mode, then what SLURM adds.
    states: dict[str, int] = {}
    for view in views:
        states[view.state] = states.get(view.state, 0) + 1
    rows = sum(int((v.status or {}).get("rows_done") or 0) for v in views)
    failed = sum(int((v.status or {}).get("rows_failed") or 0) for v in views)
    listed = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    click.echo(f"{counts['total']} shard(s): {listed}; {rows} rows done, {failed} failed")
    dead = [v.shard_id for v in views if v.state in ("stale", "failed", "exhausted") and v.task]
    if dead:
        click.echo(f"ended in SLURM without success: shard(s) {dead} ('mmirage retry -y')")
    for view in views:
        for note in view.notes:
            click.echo(note, err=True)
    if retry and counts["successful"] != counts["total"]:
        code = resubmit_failed(cfg, path, yes, id_on_stdout=True)
        if code:
            return code
    return 0 if counts["successful"] == counts["total"] else 1


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
@click.option("--shard-ids", default=None, help="Submit only these shards, e.g. 0,2,3.")
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
    """
    path = config_path(config, config_option)
    with user_errors_exit_2():
        cfg = load(path)
    if cfg.execution_params.mode != "slurm":
        fail("submit needs execution_params.mode: slurm (in local mode use 'mmirage run')", 2)
    ids = _shard_ids(shard_ids, cfg.loading_params.num_shards)
    if print_script:
        from mmirage.executors.slurm import workdir_of
        from mmirage.executors.slurm_script import JobSpec, render_job_script

        wanted = ids if ids is not None else range(cfg.loading_params.num_shards)
        spec = JobSpec(path.resolve(), tuple(wanted), workdir_of(cfg), log_level=_log_level())
        click.echo(render_job_script(cfg.execution_params, spec), nl=False)
        return
    follow = wait or cfg.execution_params.retry or cfg.execution_params.merge
    sys.exit(run_on_slurm(cfg, path, shard_ids=ids, follow=follow))


COMMANDS = (submit,)
