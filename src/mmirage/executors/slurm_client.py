"""SLURM's commands (sbatch, squeue, sacct, scancel) as calls that answer or say why not.

SLURM schedules; we only submit and ask. A query that fails (slurmctld busy or restarting) is
retried with backoff a bounded number of times; a job SLURM no longer knows (purged) is simply
absent from the answer, never a reason to wait forever.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mmirage.errors import UserError, WorkFailed

# States in which a task may still run (or run again); anything else is final.
ACTIVE_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "REQUEUED",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "RESIZING",
        "SIGNALING",
        "STAGE_OUT",
        "SUSPENDED",
        "STOPPED",
    }
)
# squeue's answer when none of the asked-for jobs exists any more.
_PURGED = re.compile(r"Invalid job id", re.IGNORECASE)
_NO_ACCOUNTING = re.compile(r"accounting storage is disabled|not running a supported", re.I)
# 123_4, or a pending range in sacct: 123_[4-6,9]
_TASK_ID = re.compile(r"^(?P<job>\d+)(?:_(?P<task>\d+|\[[\d,\-%]+\]))?$")


class SlurmUnavailableError(WorkFailed):
    """A SLURM command is missing or kept failing; the message says which and what to do."""


class SlurmRejectedError(UserError):
    """sbatch refused the job (account, partition, time...): its own message, one sentence."""


@dataclass(frozen=True)
class TaskInfo:
    """One array task as SLURM sees it."""

    job_id: str
    task: int
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, ...
    elapsed: str = ""
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def _one_sentence(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(re.sub(r"^(sbatch|squeue|sacct|scancel): error: ", "", ln) for ln in lines)


def _expand(task: str) -> list[int]:
    if not task.startswith("["):
        return [int(task)]
    out: list[int] = []
    for part in task.strip("[]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        out += list(range(int(low), int(high or low) + 1))
    return out


def parse_rows(lines: Iterable[str]) -> dict[tuple[str, int], TaskInfo]:
    """``JOBID|STATE|ELAPSED|REASON`` lines (squeue -r or sacct -P) → tasks by (job, task)."""
    found: dict[tuple[str, int], TaskInfo] = {}
    for line in lines:
        fields = line.strip().split("|")
        if len(fields) < 2:
            continue
        match = _TASK_ID.match(fields[0])
        if not match or match["task"] is None:
            continue  # a job step (123_4.batch) or a plain job: not one of our array tasks
        state = fields[1].split()[0].rstrip("+")  # "CANCELLED by 0" → CANCELLED
        elapsed = fields[2] if len(fields) > 2 else ""
        reason = fields[3] if len(fields) > 3 else ""
        for task in _expand(match["task"]):
            found[(match["job"], task)] = TaskInfo(match["job"], task, state, elapsed, reason)
    return found


class SlurmClient:
    """sbatch / squeue / sacct / scancel, with bounded retries for the queries."""

    def __init__(
        self,
        *,
        attempts: int = 6,
        backoff_s: float = 1.0,
        timeout_s: float = 60.0,
        run: Runner = subprocess.run,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.attempts, self.backoff_s, self.timeout_s = attempts, backoff_s, timeout_s
        self._run, self._sleep = run, sleep
        self._accounting: bool | None = None  # unknown until sacct answers once

    @staticmethod
    def installed() -> bool:
        return shutil.which("sbatch") is not None

    def _call(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        try:
            return self._run(
                list(argv), capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except FileNotFoundError:
            raise SlurmUnavailableError(f"{argv[0]} is not on PATH") from None
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 124, "", f"timed out after {self.timeout_s}s")

    def _query(self, argv: Sequence[str], *, ok_when: re.Pattern[str] | None = None) -> list[str]:
        """Lines of a query's answer, retrying a failure with backoff (bounded)."""
        delay, problem = self.backoff_s, ""
        for attempt in range(self.attempts):
            done = self._call(argv)
            if done.returncode == 0:
                return done.stdout.splitlines()
            if ok_when is not None and ok_when.search(done.stderr):
                return []
            problem = _one_sentence(done.stderr or done.stdout) or f"exit {done.returncode}"
            if attempt + 1 < self.attempts:
                self._sleep(delay)
                delay = min(delay * 2, 30.0)
        raise SlurmUnavailableError(
            f"{argv[0]} failed {self.attempts} times ({problem}); the jobs keep running: "
            "run `mmirage check CONFIG` once SLURM answers again"
        )

    def submit(self, script: Path) -> str:
        """Submit ``script``; its job id. Never retried: a retry after a lost answer could
        submit the array twice."""
        done = self._call(["sbatch", "--parsable", str(script)])
        if done.returncode != 0:
            message = _one_sentence(done.stderr or done.stdout) or f"exit {done.returncode}"
            raise SlurmRejectedError(f"sbatch refused the job: {message}")
        job_id = done.stdout.strip().split(";")[0]  # "123" or "123;cluster"
        if not job_id.isdigit():
            raise SlurmRejectedError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
        return job_id

    def tasks(self, job_ids: Sequence[str]) -> dict[tuple[str, int], TaskInfo]:
        """Every known task of these jobs: one squeue call (live and recently ended tasks),
        then one sacct call for the tasks squeue has forgotten, where accounting exists."""
        ids = ",".join(sorted(set(job_ids)))
        if not ids:
            return {}
        found = parse_rows(
            self._query(
                ["squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", "%i|%T|%M|%r"],
                ok_when=_PURGED,
            )
        )
        if self._accounting is not False:
            found = {**self._sacct(ids), **found}  # squeue is the fresher of the two
        return found

    def _sacct(self, ids: str) -> dict[tuple[str, int], TaskInfo]:
        argv = ["sacct", "-n", "-P", "-X", "-j", ids, "-o", "JobID,State,Elapsed,Reason"]
        done = self._call(argv)
        if done.returncode != 0 and _NO_ACCOUNTING.search(done.stderr):
            self._accounting = False  # this cluster keeps no accounting: ask squeue only
            return {}
        if done.returncode != 0:
            return parse_rows(self._query(argv))
        self._accounting = True
        return parse_rows(done.stdout.splitlines())

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._query(["scancel", *job_ids])
