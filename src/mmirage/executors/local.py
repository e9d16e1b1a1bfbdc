"""The local executor: shards run here, one after another, or ``local_parallel_shards`` at a
time as child processes (``executors.parallel``); failed shards are retried per the plan."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mmirage.errors import UserError, WorkFailed
from mmirage.executors.base import Executor, RunPlan, RunRequest, summary
from mmirage.executors.outcome import (
    RunResult,
    ShardOutcome,
    conclude,
    describe,
    requests_line,
    stats_json,
)
from mmirage.executors.preflight import check_before_run
from mmirage.executors.signals import die_with_parent, stop_on_signals
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.core.shard.runner import ShardReport

RunShard = Callable[..., "ShardReport"]  # mmirage.core.shard.run_shard's signature


def _attempts(run_dir: RunDir, shard_id: int) -> int:
    from mmirage.core.shard.state import read_status

    return int((read_status(run_dir.status_path(shard_id)) or {}).get("attempts") or 0)


def run_one(
    cfg: MMirageConfig,
    run_dir: RunDir,
    shard_id: int,
    plan: RunPlan,
    run_id: str,
    run_shard: RunShard | None = None,
) -> ShardOutcome:
    """Run one shard here (with ``run_shard``, default the shard runner's), retrying per
    ``plan``; a conflict is this shard's outcome only, a problem the user must fix
    (``UserError``, a missing key) ends the run."""
    from llm_kit.errors import ConfigError as KitConfigError
    from mmirage.core.shard import run_shard as default_run_shard
    from mmirage.core.shard import shard_state
    from mmirage.core.shard.state import (
        EXHAUSTED,
        ShardConflictError,
        ensure_writable_dir,
        read_status,
    )

    n, max_retries = cfg.loading_params.num_shards, cfg.execution_params.max_retries
    name = f"shard {shard_id}/{n}"
    state = shard_state(read_status(run_dir.status_path(shard_id)), max_retries)
    if plan.retry and state == EXHAUSTED and not plan.force_retry:
        click.echo(f"{name}: out of retries; rerun with --force-retry", err=True)
        return ShardOutcome(shard_id, problem="out of retries")
    ensure_writable_dir(run_dir.shard_dir(shard_id), "loading_params.state_dir")
    run_shard = run_shard or default_run_shard
    force, reset, fresh = plan.recompute, plan.force_retry, plan.fresh
    tries = 0
    while True:
        tries += 1
        try:
            report = run_shard(
                cfg,
                shard_id,
                force=force,
                fresh=fresh,
                reset_attempts=reset,
                retry_rows=plan.retry_rows,
                run_id=run_id,
                export_prompts=plan.export_prompts,
                run_dir=run_dir,
            )
        except (UserError, KitConfigError):
            raise  # retrying cannot fix it
        except ShardConflictError as exc:
            click.echo(f"{name}: not run: {exc}", err=True)
            return ShardOutcome(shard_id, problem=str(exc))
        except Exception as exc:
            if logging.getLogger().isEnabledFor(logging.DEBUG):
                logging.getLogger(__name__).exception("%s failed", name)
            attempts = _attempts(run_dir, shard_id)
            # A retry resumes from the checkpoint, and takes what the failed attempt bought.
            force = reset = fresh = False
            # `tries` bounds the loop even when the shard failed before it could count an
            # attempt in status.json (then `attempts` would never grow).
            if plan.retry and attempts <= max_retries and tries <= max_retries:
                click.echo(f"{name}: failed (attempt {attempts}): {exc}", err=True)
                continue  # the last attempt's reason is said once, by conclude
            return ShardOutcome(shard_id, problem=f"failed after {attempts} attempt(s): {exc}")
        click.echo(f"{name}: {describe(report)}", err=True)
        if requests := requests_line(report):
            click.echo(f"{name}: {requests}", err=True)
        for note in report.notes:
            click.echo(f"{name}: {note}", err=True)
        return ShardOutcome(shard_id, ok=True, stats=asdict(report))


class LocalExecutor(Executor):
    """Shards run on this machine; a shard named on the command line always runs here.

    Injection points: ``run_shard`` replaces the shard runner for shards run in this process;
    ``handle_signals=False`` leaves the process's SIGINT and SIGTERM handlers alone (an
    embedding program).
    """

    def __init__(
        self,
        cfg: MMirageConfig,
        config_path: Path,
        run_id: str,
        *,
        run_shard: RunShard | None = None,
        handle_signals: bool = True,
    ) -> None:
        super().__init__(cfg, config_path, run_id)
        self._run_shard = run_shard
        self._handle_signals = handle_signals

    def run(self, request: RunRequest) -> RunResult:
        lp = self.cfg.loading_params
        shards = request.shards
        if shards is None:
            shards = [lp.shard_id] if lp.shard_id is not None else list(range(lp.num_shards))
        self._as_shard_process()
        if request.plan.export_prompts is not None:
            outcomes = self._export(shards, request.plan)
            return RunResult(False, shards, lambda: self._conclude(outcomes, request.stats))
        check_before_run(self.cfg, self.run_dir)
        outcomes = self.run_shards(shards, request.plan, "run")
        finished = all(o.ok for o in outcomes)
        return RunResult(finished, shards, lambda: self._conclude(outcomes, request.stats))

    def retry(self, shards: list[int] | None, *, stats: bool, yes: bool) -> int:
        from mmirage.core.shard.health import PARTIAL, ShardHealth, shard_health
        from mmirage.core.shard.published import DAMAGED, OUTDATED
        from mmirage.core.shard.state import EXHAUSTED, FAILED, MISSING, STALE, SUCCESS, UNKNOWN

        n = self.cfg.loading_params.num_shards

        def healths() -> dict[int, ShardHealth]:
            return {k: shard_health(self.cfg, self.run_dir, k, self.config_path) for k in range(n)}

        def states() -> dict[int, str]:
            return {k: health.state for k, health in healths().items()}

        seen = healths()
        before = {k: health.state for k, health in seen.items()}
        chosen = shards if shards is not None else list(range(n))
        redo = (FAILED, STALE, MISSING, UNKNOWN, PARTIAL, OUTDATED)
        todo = [k for k in chosen if before[k] in redo]
        for k in chosen:
            if before[k] == EXHAUSTED:
                click.echo(
                    f"shard {k}/{n}: out of retries; 'mmirage run --force-retry' resets", err=True
                )
            elif before[k] == DAMAGED:  # retry does not salvage: it says how
                click.echo(f"error: {seen[k].notes[0]}", err=True)
        self._as_shard_process()
        outcomes: list[ShardOutcome] = []
        if todo:
            check_before_run(self.cfg, self.run_dir)
            outcomes = self.run_shards(todo, RunPlan(retry=True, retry_rows=True), "retry")
        after = states()
        report: dict[str, object] = dict(summary([after[k] for k in chosen]))
        if stats:
            reports = [o.stats for o in outcomes if o.stats is not None]
            report["stats"] = stats_json(reports, tokens_known=not self.cfg.uses_batch_api)
        click.echo(json.dumps(report, indent=2))
        if any(o.user_error for o in outcomes):
            raise UserError("a shard stopped on a configuration problem (see above)")
        unfinished = len(chosen) - int(str(report["successful"]))
        if unfinished:  # the summary above counts them; the sentence says which
            late = [k for k in chosen if after[k] != SUCCESS]
            raise WorkFailed(f"{unfinished} shard(s) have not succeeded: {late}")
        return 0

    def check(self, *, retry_failed: bool, yes: bool) -> int:
        from mmirage.executors.local_check import check_table

        if retry_failed:
            raise UserError(
                "--retry resubmits SLURM tasks (mode: slurm); here run 'mmirage retry CONFIG'"
            )
        return check_table(self.cfg, self.run_dir, self.config_path)

    def run_shards(self, shards: list[int], plan: RunPlan, command: str) -> list[ShardOutcome]:
        """``shards`` one after another, or ``local_parallel_shards`` at a time as children
        (``mmirage COMMAND CONFIG --shard-id K``, which run the same ``run_one``)."""
        ep = self.cfg.execution_params
        width = ep.local_parallel_shards if ep.mode == "local" else 1
        if width <= 1 or len(shards) <= 1:
            return [
                run_one(self.cfg, self.run_dir, k, plan, self.run_id, self._run_shard)
                for k in shards
            ]
        from mmirage.executors.parallel import ParallelRun  # only for child processes

        extra = plan.flags()
        parallel = ParallelRun(
            self.cfg,
            self.run_dir,
            self.config_path,
            command,
            extra,
            width,
            self.run_id,
            handle_signals=self._handle_signals,
        )
        return parallel.run(shards)

    def _conclude(self, outcomes: list[ShardOutcome], stats: bool) -> None:
        conclude(outcomes, stats, tokens_known=not self.cfg.uses_batch_api)

    def _as_shard_process(self) -> None:
        if not self._handle_signals:
            return
        ep = self.cfg.execution_params
        stop_on_signals(ep.stop_grace_seconds, ep.signal_grace_seconds)
        die_with_parent()

    def _export(self, shards: list[int], plan: RunPlan) -> list[ShardOutcome]:
        """The dry run: shards run here, one after another, on a throwaway copy of their state
        (nothing a real run would trust), and the requests land in the export file."""
        import tempfile

        from mmirage.core.process.batch.dry_run import check_dry_run_allowed, dry_run_config
        from mmirage.core.process.batch.processor import export_file

        export_path = plan.export_prompts
        assert export_path is not None
        target = export_file(export_path, self.run_id)
        check_dry_run_allowed(self.cfg, target, export_path)
        with tempfile.TemporaryDirectory(prefix="mmirage-dry-run-") as tmp:
            dry = dry_run_config(self.cfg, self.run_dir, Path(tmp))
            dry_dir = RunDir.of(dry)
            plan = replace(plan, retry=False)
            outcomes = [
                run_one(dry, dry_dir, k, plan, self.run_id, self._run_shard) for k in shards
            ]
        if all(o.ok for o in outcomes):
            click.echo(f"exported the requests to {target}", err=True)
        return outcomes
