"""SLURM's commands (sbatch, squeue, sacct, scancel) as calls that answer or say why not.

SLURM schedules; we only submit and ask. A query that fails (slurmctld busy or restarting) is
retried with backoff a bounded number of times; a job SLURM no longer knows (purged) is simply
absent from the answer, never a reason to wait forever.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
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


def run_bounded(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``argv``'s answer, or exit 124 once ``timeout_s`` has passed. The command runs in a
    session of its own, killed whole on timeout: a wrapper script's child that holds the
    pipes open would otherwise keep the caller waiting past any timeout."""
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return subprocess.CompletedProcess(argv, 124, "", f"no answer within {timeout_s:.0f} s")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


Runner = Callable[[Sequence[str], float], subprocess.CompletedProcess[str]]


class SlurmClient:
    """sbatch / squeue / sacct / scancel. A query that fails or hangs is asked again with
    backoff within ``budget_s`` in all (calls and waits together), then given up."""

    def __init__(
        self,
        *,
        budget_s: float = 30.0,
        call_timeout_s: float = 10.0,
        submit_timeout_s: float = 60.0,
        run: Runner = run_bounded,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget_s, self.call_timeout_s = budget_s, call_timeout_s
        self.submit_timeout_s = submit_timeout_s
        self._run, self._sleep, self._clock = run, sleep, clock
        self._accounting: bool | None = None  # unknown until sacct answers once

    @staticmethod
    def installed() -> bool:
        return shutil.which("sbatch") is not None

    def _call(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        try:
            return self._run(argv, timeout_s)
        except FileNotFoundError:
            raise SlurmUnavailableError(f"{argv[0]} is not on PATH") from None

    def _query(
        self, argv: Sequence[str], *, deadline: float, gives_up_when: re.Pattern[str] | None = None
    ) -> list[str] | None:
        """Lines of a query's answer, asking again with backoff until ``deadline``; ``None``
        when its error matches ``gives_up_when`` (an answer in itself)."""
        delay, asked, problem = 1.0, 0, ""
        while True:
            left = deadline - self._clock()
            done = self._call(argv, max(1.0, min(self.call_timeout_s, left)))
            asked += 1
            if done.returncode == 0:
                return done.stdout.splitlines()
            if gives_up_when is not None and gives_up_when.search(done.stderr):
                return None
            problem = _one_sentence(done.stderr or done.stdout) or f"exit {done.returncode}"
            left = deadline - self._clock()
            if left <= 1.0:
                break
            self._sleep(min(delay, left - 1.0))
            delay = min(delay * 2, 8.0)
        raise SlurmUnavailableError(
            f"{argv[0]} failed {asked} times in {self.budget_s:.0f} s ({problem}); the jobs "
            "keep running: run `mmirage check CONFIG` once SLURM answers again"
        )

    def submit(self, script: Path) -> str:
        """Submit ``script``; its job id. Never retried: a retry after a lost answer could
        submit the array twice."""
        done = self._call(["sbatch", "--parsable", str(script)], self.submit_timeout_s)
        if done.returncode == 124:
            raise SlurmUnavailableError(
                f"sbatch gave no answer within {self.submit_timeout_s:.0f} s; the job may have "
                "been submitted: look with `squeue --me` before running again"
            )
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
        deadline = self._clock() + self.budget_s  # squeue and sacct together
        squeue = ["squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", "%i|%T|%M|%r"]
        found = parse_rows(self._query(squeue, deadline=deadline, gives_up_when=_PURGED) or [])
        if self._accounting is not False:
            found = {**self._sacct(ids, deadline), **found}  # squeue is the fresher of the two
        return found

    def _sacct(self, ids: str, deadline: float) -> dict[tuple[str, int], TaskInfo]:
        argv = ["sacct", "-n", "-P", "-X", "-j", ids, "-o", "JobID,State,Elapsed,Reason"]
        lines = self._query(argv, deadline=deadline, gives_up_when=_NO_ACCOUNTING)
        if lines is None:
            self._accounting = False  # this cluster keeps no accounting: ask squeue only
            return {}
        self._accounting = True
        return parse_rows(lines)

    def cancel(self, job_ids: Sequence[str]) -> None:
        if job_ids:
            self._query(["scancel", *job_ids], deadline=self._clock() + self.budget_s)
