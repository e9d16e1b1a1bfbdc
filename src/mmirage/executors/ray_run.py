"""The Ray executor (``execution_params.mode: ray``): each shard runs as a Ray task on the
cluster (``ray_task``), at most ``ray.max_concurrent_shards`` at a time; ``mmirage run`` says
the cluster's address, one line per shard as it ends, and returns when every shard has ended.

Everything else is the local executor's: the checks before the run, ``retry`` (the shards that
did not succeed, run again as Ray tasks), ``check`` (the state folder's table), the final report
and its exit status. Before the first task, every node must see the state folder
(``ray_state_check``). A task whose worker or node dies is run again by Ray (up to
``max_retries`` times) on a node that is alive, and resumes from its checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import time
from types import ModuleType
from typing import Any

import click

from mmirage.executors.base import RunPlan
from mmirage.executors.local import LocalExecutor
from mmirage.executors.outcome import ShardOutcome

# How long stopped tasks get to record "interrupted" before the driver gives up on them.
STOP_WAIT_S = 30.0
WAIT_S = 0.5  # the longest a noted signal waits to be acted on


class RayExecutor(LocalExecutor):
    """Shards run as Ray tasks; a shard named on the command line runs here (``HERE``)."""

    def run_shards(self, shards: list[int], plan: RunPlan, command: str) -> list[ShardOutcome]:
        # The parallel run's signal noting and last sentence, imported only when shards run.
        from mmirage.executors.parallel import _interrupted, _NotedSignals
        from mmirage.executors.ray_cluster import connect
        from mmirage.executors.ray_env import forwarded_env
        from mmirage.executors.ray_state_check import check_nodes_see_state
        from mmirage.executors.ray_task import run_shard_task

        settings = self.cfg.execution_params.ray
        ray = connect(settings)
        nodes = check_nodes_see_state(ray, self.run_dir)
        click.echo(f"ray: {nodes} node(s) see the state folder; {len(shards)} shard(s)", err=True)
        task = ray.remote(run_shard_task).options(
            max_retries=self.cfg.execution_params.max_retries,
            retry_exceptions=False,  # a shard's own failures are retried by run_one, per plan
            **settings.task_options(),
        )
        width = settings.max_concurrent_shards or len(shards)
        cwd, env = os.getcwd(), forwarded_env(self.cfg)
        waiting = list(shards)
        running: dict[Any, int] = {}
        outcomes: dict[int, ShardOutcome] = {}
        stopped_at: float | None = None
        # Signals are only noted: one raised inside ray.wait comes out as a bare exit 1.
        with _NotedSignals(self._handle_signals) as signals:
            try:
                while (waiting and not signals.received) or running:
                    if signals.received and stopped_at is None:
                        stopped_at = _stop(ray, list(running))
                    if stopped_at is not None and time.monotonic() - stopped_at > STOP_WAIT_S:
                        break  # tasks that did not end in time: their state is stale
                    while waiting and len(running) < width and not signals.received:
                        k = waiting.pop(0)
                        ref = task.remote(self.cfg, self.run_dir, k, plan, self.run_id, cwd, env)
                        running[ref] = k
                    ended, _ = ray.wait(list(running), num_returns=1, timeout=WAIT_S)
                    for ref in ended:
                        k = running.pop(ref)
                        outcomes[k] = _outcome(ray, ref, k)
                        click.echo(self._ended_line(outcomes[k]), err=True)
                        if outcomes[k].user_error:
                            waiting.clear()  # a problem the user must fix: start no more
            except BaseException:
                _stop(ray, list(running))  # the tasks record where they were, then end
                raise
        why = "interrupted" if signals.received else "a shard stopped on a configuration problem"
        for k in shards:
            outcomes.setdefault(k, ShardOutcome(k, problem=f"not finished ({why})"))
        ordered = [outcomes[k] for k in shards]
        if signals.received and not all(o.ok for o in ordered):
            raise SystemExit(_interrupted(signals.received[0], ordered))
        return ordered

    def _ended_line(self, outcome: ShardOutcome) -> str:
        name = f"ray: shard {outcome.shard_id}/{self.cfg.loading_params.num_shards}"
        if not outcome.ok:
            return f"{name} failed: {outcome.problem}"
        stats = outcome.stats or {}
        return (
            f"{name} succeeded: {int(stats.get('rows_done') or 0)} rows "
            f"({int(stats.get('rows_failed') or 0)} failed)"
        )

    def _as_shard_process(self) -> None:
        """The driver runs no shard: its signals are noted around the wait (``run_shards``)."""


def _outcome(ray: ModuleType, ref: Any, shard_id: int) -> ShardOutcome:
    """What the task returned; a task Ray gave up on (its retries spent on dead nodes or
    workers, or cancelled) is that shard's failure, and ``mmirage retry`` resumes it."""
    try:
        outcome = ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return ShardOutcome(shard_id, problem="stopped; the same command resumes it")
    except ray.exceptions.RayError as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return ShardOutcome(shard_id, problem=f"its Ray task ended: {type(exc).__name__}: {why}")
    assert isinstance(outcome, ShardOutcome)
    return outcome


def _stop(ray: ModuleType, refs: list[Any]) -> float:
    """Cancel the running tasks: each gets a KeyboardInterrupt and records where it stopped
    (its requests in flight are abandoned); when that began."""
    for ref in refs:
        with contextlib.suppress(Exception):
            ray.cancel(ref)
    return time.monotonic()
