"""The SLURM executor (``execution_params.mode: slurm``): ``run`` and ``submit`` submit the
unfinished shards as one ``sbatch`` array and print its job id alone on stdout; following it
(``--wait``, ``retry: true``, ``merge: true``) waits for the array and resubmits failed shards up
to ``max_retries`` times; ``check`` joins each shard's status with SLURM's view of its task;
``retry`` and ``check --retry`` resubmit the failed and dead shards as one array.

Errors: ``UserError`` when the user must fix something (no sbatch, sbatch refused the job),
``WorkFailed`` when the work failed or SLURM kept failing to answer.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mmirage.core.shard.state import SUCCESS
from mmirage.errors import UserError, WorkFailed
from mmirage.executors.base import Executor, RunRequest, summary
from mmirage.executors.console import print_table
from mmirage.executors.outcome import RunResult
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.executors.slurm import ShardView, Submission
    from mmirage.executors.slurm_client import SlurmClient, TaskInfo

NO_SBATCH = "mode: slurm needs SLURM's sbatch on PATH (or use mode: local)"


def slurm_client() -> SlurmClient:
    from mmirage.executors.slurm_client import SlurmClient

    if not SlurmClient.installed():
        raise UserError(NO_SBATCH)
    return SlurmClient()


def _log_level() -> str:
    return logging.getLevelName(logging.getLogger().getEffectiveLevel())


def submit_shards(
    cfg: MMirageConfig,
    run_dir: RunDir,
    path: Path,
    shard_ids: Sequence[int],
    client: SlurmClient,
    *,
    id_on_stdout: bool = True,
    command: str = "run",
    args: tuple[str, ...] = (),
) -> Submission:
    """One sbatch array for ``shard_ids``; its job id alone on stdout (``JOB=$(mmirage run
    c.yaml)``), the rest on stderr."""
    from mmirage.executors.preflight import check_before_run
    from mmirage.executors.slurm import submit
    from mmirage.executors.slurm_client import SlurmUnavailableError

    check_before_run(cfg, run_dir)  # here, as a local run would: not in a task, hours later
    try:
        record = submit(
            cfg,
            run_dir,
            path,
            shard_ids,
            client,
            log_level=_log_level(),
            command=command,
            args=args,
        )
    except SlurmUnavailableError as exc:  # sbatch itself is missing or broken here
        raise UserError(str(exc)) from exc
    if id_on_stdout:
        click.echo(record.job_id)
    click.echo(
        f"submitted SLURM job {record.job_id}: shard(s) {list(record.shards)}; "
        f"job script {record.script}",
        err=True,
    )
    return record


def joined_views(
    cfg: MMirageConfig, run_dir: RunDir, path: Path, client: SlurmClient
) -> list[ShardView]:
    """Every shard joined with its task (``SlurmUnavailableError``, a ``WorkFailed``, when
    SLURM kept failing to answer)."""
    from mmirage.executors.slurm import shard_views

    return shard_views(cfg, run_dir, path, client)


def submit_unfinished(
    cfg: MMirageConfig,
    run_dir: RunDir,
    path: Path,
    client: SlurmClient,
    wanted: list[int],
    *,
    args: tuple[str, ...] = (),
    recompute: bool = False,
) -> list[str]:
    """Submit the shards of ``wanted`` that are not finished (nor queued) — a finished one too
    when ``recompute`` or when it was computed under another configuration; the job ids.
    ``args`` go to every task (the run id and its flags)."""
    from mmirage.executors.slurm import unfinished

    views = joined_views(cfg, run_dir, path, client)
    fp = run_dir.fingerprint
    again = {
        v.shard_id
        for v in views
        if v.state == SUCCESS
        and (recompute or (v.status or {}).get("fingerprint") not in (None, fp))
    }
    todo = sorted(k for k in set(unfinished(views)) | again if k in wanted)
    skipped = sorted(set(wanted) - set(todo))
    if skipped:
        click.echo(f"not submitted (succeeded, queued or out of retries): {skipped}", err=True)
    return [submit_shards(cfg, run_dir, path, todo, client, args=args).job_id] if todo else []


def _queued_jobs(views: Sequence[ShardView], wanted: Sequence[int]) -> list[str]:
    return sorted(
        {v.task.job_id for v in views if v.task and v.task.active and v.shard_id in wanted}
    )


def follow(
    cfg: MMirageConfig,
    run_dir: RunDir,
    path: Path,
    client: SlurmClient,
    wanted: list[int],
    jobs: list[str],
) -> list[ShardView]:
    """Wait for the shards' tasks and resubmit the failed ones (``retry``); the shards of
    ``wanted`` that did not succeed."""
    from mmirage.executors.slurm import wait_for

    ep = cfg.execution_params
    views = joined_views(cfg, run_dir, path, client)
    jobs = sorted(set(jobs) | set(_queued_jobs(views, wanted)))
    resubmits = 0
    while True:
        wait_for(
            jobs,
            client,
            poll_s=ep.poll_interval_seconds,
            settle_s=ep.settle_time_seconds,
            on_poll=_Progress(len(wanted)),
        )
        views = joined_views(cfg, run_dir, path, client)
        bad = [v for v in views if v.shard_id in wanted and v.state != "success"]
        again = [v.shard_id for v in bad if v.retryable and v.state != "exhausted"]
        if not bad or not ep.retry or not again or resubmits >= ep.max_retries:
            return bad
        resubmits += 1
        click.echo(f"resubmitting shard(s) {again} (round {resubmits}/{ep.max_retries})", err=True)
        jobs = [submit_shards(cfg, run_dir, path, again, client, command="retry").job_id]


def _conclude(bad: list[ShardView], wanted: list[int]) -> None:
    if bad:
        for view in bad:
            click.echo(f"shard {view.shard_id}: {describe(view)}", err=True)
        raise WorkFailed(f"{len(bad)} of {len(wanted)} shard(s) did not succeed")


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


def check_table(
    cfg: MMirageConfig, run_dir: RunDir, path: Path
) -> tuple[list[list[str]], list[ShardView]]:
    """The rows of ``check``'s table in slurm mode (one squeue call for every task)."""
    client = slurm_client()
    views = joined_views(cfg, run_dir, path, client)
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


def resubmit_failed(
    cfg: MMirageConfig, run_dir: RunDir, path: Path, yes: bool, *, id_on_stdout: bool
) -> int:
    """``check --retry`` / ``retry``: the failed and dead shards as one array, after asking."""
    from mmirage.executors.slurm import unfinished

    client = slurm_client()
    todo = unfinished(joined_views(cfg, run_dir, path, client))
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
    submit_shards(cfg, run_dir, path, todo, client, id_on_stdout=id_on_stdout, command="retry")
    return 0


def _check(cfg: MMirageConfig, run_dir: RunDir, path: Path, retry: bool, yes: bool) -> int:
    """``mmirage check`` in slurm mode: the joined table, a summary, and ``--retry``."""
    from mmirage.core.shard.report import failed_summary

    lines, views = check_table(cfg, run_dir, path)
    print_table(lines)
    counts = summary([v.state for v in views])
    # The same summary line as in local mode, then what SLURM adds.
    states: dict[str, int] = {}
    for view in views:
        states[view.state] = states.get(view.state, 0) + 1
    rows = sum(int((v.status or {}).get("rows_done") or 0) for v in views)
    failed = sum(int((v.status or {}).get("rows_failed") or 0) for v in views)
    retryable = sum(int((v.status or {}).get("rows_retryable") or 0) for v in views)
    listed = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    rows_line = f"{rows} rows done, {failed_summary(failed, retryable)}"
    click.echo(f"{counts['total']} shard(s): {listed}; {rows_line}")
    dead = [v.shard_id for v in views if v.state in ("stale", "failed", "exhausted") and v.task]
    if dead:
        click.echo(f"ended in SLURM without success: shard(s) {dead} ('mmirage retry -y')")
    for view in views:
        for note in view.notes:
            click.echo(note, err=True)
    if retry and counts["successful"] != counts["total"]:
        code = resubmit_failed(cfg, run_dir, path, yes, id_on_stdout=True)
        if code:
            return code
    return 0 if counts["successful"] == counts["total"] else 1


class SlurmExecutor(Executor):
    """Shards run as SLURM array tasks, each ``mmirage run|retry CONFIG --shard-id K``."""

    def run(self, request: RunRequest) -> RunResult:
        n = self.cfg.loading_params.num_shards
        wanted = sorted(set(range(n) if request.shards is None else request.shards))
        client = slurm_client()
        plan = request.plan
        jobs = submit_unfinished(
            self.cfg,
            self.run_dir,
            self.config_path,
            client,
            wanted,
            args=("--run-id", self.run_id, *plan.flags()),
            recompute=plan.recompute,
        )
        if not request.follow:
            return RunResult(False, wanted, lambda: None)
        bad = follow(self.cfg, self.run_dir, self.config_path, client, wanted, jobs)
        return RunResult(not bad, wanted, lambda: _conclude(bad, wanted))

    def retry(self, shards: list[int] | None, *, stats: bool, yes: bool) -> int:
        """Resubmit, then the summary JSON on stdout."""
        import json

        code = resubmit_failed(self.cfg, self.run_dir, self.config_path, yes, id_on_stdout=False)
        views = joined_views(self.cfg, self.run_dir, self.config_path, slurm_client())
        click.echo(json.dumps(summary([v.state for v in views]), indent=2))
        return code

    def check(self, *, retry_failed: bool, yes: bool) -> int:
        """The joined table, a summary, and ``--retry``."""
        return _check(self.cfg, self.run_dir, self.config_path, retry_failed, yes)
