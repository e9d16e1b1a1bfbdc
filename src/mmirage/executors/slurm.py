"""The SLURM executor: shards run as the tasks of ``sbatch`` arrays; SLURM schedules them.

Each submission writes its job script to ``<state>/<pipeline>/slurm/`` (what ran, readable)
and appends ``{job_id, shards, script, ...}`` to ``submissions.jsonl`` there, so ``check`` can
join every shard's ``status.json`` with the latest task that ran it, in one squeue call.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmirage.config.models import MMirageConfig
from mmirage.core.shard.health import shard_health
from mmirage.core.shard.published import DAMAGED
from mmirage.core.shard.state import RUNNING, SUCCESS, now_iso
from mmirage.executors.forwarding import shard_env
from mmirage.executors.slurm_client import SlurmClient, TaskInfo
from mmirage.executors.slurm_script import JobSpec, render_job_script, task_log
from mmirage.rundir import RunDir

SUBMISSIONS = "submissions.jsonl"
# A status file saying "running" while SLURM says the task ended: the task died unrecorded.
DEAD_STATES = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
)


@dataclass(frozen=True)
class Submission:
    job_id: str
    shards: tuple[int, ...]
    script: str
    job_name: str
    workdir: str


@dataclass(frozen=True)
class ShardView:
    """One shard as ``check`` shows it: our status joined with SLURM's view of its task."""

    shard_id: int
    state: str  # shard_health's answer, corrected by SLURM (a dead task is "stale")
    status: dict[str, Any] | None
    task: TaskInfo | None
    log: str | None
    notes: list[str]  # shard_health's sentences (damaged file, rows to retry, ...)

    @property
    def retryable(self) -> bool:
        """A resubmission can finish it (a damaged file needs the user first)."""
        return self.state not in (SUCCESS, RUNNING, DAMAGED, "exhausted")


def workdir_of(cfg: MMirageConfig) -> Path:
    root = cfg.execution_params.project_root
    return Path(os.path.expanduser(root)).resolve() if root else Path.cwd()


def write_script(cfg: MMirageConfig, run_dir: RunDir, spec: JobSpec) -> Path:
    """The job script for ``spec``, in the state folder, before anything is submitted."""
    folder = run_dir.slurm_dir.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"job-{stamp}-{os.getpid()}-{len(list(folder.glob('job-*.sh')))}.sh"
    path.write_text(render_job_script(cfg.execution_params, spec), encoding="utf-8")
    return path


def submit(
    cfg: MMirageConfig,
    run_dir: RunDir,
    config_path: Path,
    shard_ids: Sequence[int],
    client: SlurmClient,
    *,
    log_level: str = "WARNING",
    command: str = "run",
    args: tuple[str, ...] = (),
) -> Submission:
    """Write the script, make the report folder, ``sbatch`` it once and record the job.
    ``command`` is what each task runs: ``run``, or ``retry`` for a resubmission (which also
    computes again the rows a finished shard holds as retryable failures)."""
    ep = cfg.execution_params
    workdir = workdir_of(cfg)
    spec = JobSpec(
        config_path.resolve(),
        tuple(shard_ids),
        workdir,
        log_level=log_level,
        command=command,
        env=tuple(shard_env(cfg).items()),
        args=args,
    )
    script = write_script(cfg, run_dir, spec)
    report_dir = Path(ep.report_dir)
    (report_dir if report_dir.is_absolute() else workdir / report_dir).mkdir(
        parents=True, exist_ok=True
    )
    job_id = client.submit(script)
    record = Submission(job_id, tuple(sorted(shard_ids)), str(script), ep.job_name, str(workdir))
    with (run_dir.slurm_dir / SUBMISSIONS).open("a", encoding="utf-8") as log:
        log.write(json.dumps({**record.__dict__, "submitted_at": now_iso()}) + "\n")
    return record


def submissions(run_dir: RunDir) -> list[Submission]:
    """Every recorded submission, oldest first (a torn last line is skipped)."""
    path = run_dir.slurm_dir / SUBMISSIONS
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    out: list[Submission] = []
    for line in lines:
        try:
            data = json.loads(line)
            out.append(
                Submission(
                    str(data["job_id"]),
                    tuple(int(k) for k in data["shards"]),
                    str(data["script"]),
                    str(data["job_name"]),
                    str(data["workdir"]),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out


def latest_tasks(run_dir: RunDir) -> dict[int, Submission]:
    """For each shard, the latest submission that included it."""
    latest: dict[int, Submission] = {}
    for record in submissions(run_dir):
        for shard in record.shards:
            latest[shard] = record
    return latest


def shard_views(
    cfg: MMirageConfig, run_dir: RunDir, config_path: Path, client: SlurmClient
) -> list[ShardView]:
    """Every shard's state, joined with SLURM's view of its latest task (one query)."""
    latest = latest_tasks(run_dir)
    tasks = client.tasks([s.job_id for s in latest.values()])
    max_retries = cfg.execution_params.max_retries
    views = []
    for k in range(cfg.loading_params.num_shards):
        health = shard_health(cfg, run_dir, k, config_path)
        status = health.status or None
        record = latest.get(k)
        task = tasks.get((record.job_id, k)) if record else None
        state = _joined_state(health.state, status, task, max_retries)
        log = None
        if record:
            log = task_log(
                cfg.execution_params, Path(record.workdir), record.job_name, record.job_id, k
            )
        views.append(ShardView(k, state, status, task, log, health.notes))
    return views


def _joined_state(
    state: str, status: dict[str, Any] | None, task: TaskInfo | None, max_retries: int
) -> str:
    """Our state, unless SLURM knows better: a task that ended without recording its end
    (scancel, OOM, node failure, time limit) is dead, not running; one that waits in the
    queue is running from the pipeline's point of view (it will run)."""
    if task is None:
        return state
    if task.active and state != SUCCESS:
        return RUNNING
    if state == RUNNING and not task.active:
        attempts = int((status or {}).get("attempts") or 0)
        return "exhausted" if attempts > max_retries else "stale"
    return state


def unfinished(views: Sequence[ShardView]) -> list[int]:
    """Shards to submit: neither succeeded nor queued or running in SLURM, nor damaged or out
    of retries (those need the user first)."""
    return [v.shard_id for v in views if v.retryable]


def wait_for(
    job_ids: Sequence[str],
    client: SlurmClient,
    *,
    poll_s: float,
    settle_s: float,
    sleep: Callable[[float], None] = time.sleep,
    on_poll: Callable[[dict[tuple[str, int], TaskInfo]], None] | None = None,
) -> None:
    """Until none of the jobs' tasks is queued or running (purged jobs count as ended), then
    ``settle_s`` for the shards' last status writes to reach a shared filesystem."""
    while True:
        tasks = client.tasks(job_ids)
        if on_poll is not None:
            on_poll(tasks)
        if not any(t.active for t in tasks.values()):
            break
        sleep(poll_s)
    if settle_s:
        sleep(settle_s)
