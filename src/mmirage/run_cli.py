"""``mmirage run``, ``mmirage retry`` and ``mmirage check``: run shards locally, report their state.

Exit codes: 0 every shard succeeded; 1 some work failed (a shard failed, ran out of retries, or
could not run because another process holds it or it holds another configuration's results:
the other shards still run, and the problem is reported at the end); 2 a problem the user must
fix before anything can run (configuration, data path, a directory that cannot be written, a
missing API key). Heavy modules are imported inside the commands so ``mmirage --help`` stays
fast.

With ``execution_params.local_parallel_shards`` above 1, ``run`` and ``retry`` run that many
shards at once, each as a child ``mmirage run|retry CONFIG --shard-id K`` whose output lines are
relayed with a ``[shard K]`` prefix; stopping the parent (Ctrl-C, SIGTERM, even SIGKILL) stops
the children, which record "interrupted" and resume later from their checkpoints.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from mmirage.cli_support import config_params as _config_params
from mmirage.cli_support import config_path as _config_path
from mmirage.cli_support import debug as _debug
from mmirage.cli_support import fail as _fail
from mmirage.cli_support import has_batch_api
from mmirage.cli_support import load as _load
from mmirage.cli_support import print_table as _print_table
from mmirage.cli_support import user_errors_exit_2 as _user_errors_exit_2
from mmirage.merge_cli import merge_after_run

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.core.shard.runner import ShardReport

PARENT_PID_ENV = "MMIRAGE_PARENT_PID"  # set for a child shard process: die with that parent
STOP_GRACE_S = 30.0  # how long stopped children get to record "interrupted" before SIGKILL


def _sigterm_as_exit(grace_s: float = 0.0) -> None:
    """SIGTERM (SLURM, kill, a stopped parent) unwinds like Ctrl-C, so the shard records
    "failed" (or "time limit", near a SLURM task's deadline), not "running". Only the first
    one: a second SIGTERM (a child can get one from its dying parent and one from whoever
    stops it) would cut short the cleanup that records the shard's state."""
    from mmirage.core.shard.stop import note, stop_reason

    unwinding = False

    def handler(signum: int, frame: object) -> None:
        nonlocal unwinding
        if unwinding:
            return
        unwinding = True
        note(stop_reason(signum, grace_s))
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def _die_with_parent() -> None:
    """In a child shard process: get SIGTERM when the parent ``run`` dies, even by SIGKILL, so
    no shard keeps running (and paying) after the command that started it is gone."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != int(parent):  # the parent died before prctl took effect
        raise SystemExit(128 + signal.SIGTERM)


def _check_dirs(cfg: MMirageConfig) -> None:
    """Every key and directory the run needs, before any shard starts (exit 2 on a bad one)."""
    from mmirage.core.process.preflight import check_credentials
    from mmirage.core.shard.state import ensure_writable_dir, shard_dir

    check_credentials(cfg)

    lp = cfg.loading_params
    ensure_writable_dir(shard_dir(cfg, 0).parent, "loading_params.state_dir")
    for index, ds in enumerate(lp.datasets):
        where = f"loading_params.datasets[{index}].output_dir"
        ensure_writable_dir(Path(os.path.expanduser(ds.output_dir)) / ".parts", where)
    if has_batch_api(cfg):
        # Receipts are written after the provider accepted a batch: their folder must be
        # usable before anything is sent.
        from mmirage.core.process.batch.receipts import batch_processors, receipt_base

        state = str(shard_dir(cfg, 0).parent)
        for index, processor in enumerate(batch_processors(cfg)):
            base = Path(receipt_base(processor.provider_config, state))
            ensure_writable_dir(base.parent, f"processors[{index}].metadata_output_path")


# --- one shard, with its retries -------------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    """How the selected shards run. ``retry``: retry failures within the retry budget
    (``max_retries`` retries after the first attempt, counted by status.json ``attempts``);
    ``force_retry``: a new budget even when it is spent; ``recompute``: start from nothing;
    ``retry_rows``: compute again the published rows that failed for a retryable reason."""

    retry: bool
    force_retry: bool = False
    recompute: bool = False
    retry_rows: bool = False
    export_prompts: str | None = None  # dry run: batch_api requests go to this path


@dataclass
class ShardOutcome:
    shard_id: int
    ok: bool = False
    stats: dict[str, Any] | None = None  # the shard's report, as --stats prints it
    problem: str | None = None  # why it did not succeed, for the final report
    user_error: bool = False  # a child stopped on a problem the user must fix (exit 2)


def _attempts(cfg: MMirageConfig, shard_id: int) -> int:
    from mmirage.core.shard.state import read_status, status_path

    return int((read_status(status_path(cfg, shard_id)) or {}).get("attempts") or 0)


def run_one(cfg: MMirageConfig, shard_id: int, plan: RunPlan) -> ShardOutcome:
    """Run one shard here, retrying per ``plan``; a conflict is this shard's outcome only."""
    from mmirage.core.shard import run_shard, shard_state, status_path
    from mmirage.core.shard.state import (
        EXHAUSTED,
        ShardConflictError,
        ensure_writable_dir,
        read_status,
        shard_dir,
    )

    n, max_retries = cfg.loading_params.num_shards, cfg.execution_params.max_retries
    name = f"shard {shard_id}/{n}"
    state = shard_state(read_status(status_path(cfg, shard_id)), max_retries)
    if plan.retry and state == EXHAUSTED and not plan.force_retry:
        click.echo(f"{name}: out of retries; rerun with --force-retry", err=True)
        return ShardOutcome(shard_id, problem="out of retries")
    with _user_errors_exit_2():
        ensure_writable_dir(shard_dir(cfg, shard_id), "loading_params.state_dir")
    force, reset = plan.recompute, plan.force_retry
    tries = 0
    while True:
        tries += 1
        try:
            with _user_errors_exit_2():
                report = run_shard(
                    cfg,
                    shard_id,
                    force=force,
                    reset_attempts=reset,
                    retry_rows=plan.retry_rows,
                    export_prompts=plan.export_prompts,
                )
        except ShardConflictError as exc:
            click.echo(f"{name}: not run: {exc}", err=True)
            return ShardOutcome(shard_id, problem=str(exc))
        except Exception as exc:
            if _debug():
                logging.getLogger(__name__).exception("%s failed", name)
            attempts = _attempts(cfg, shard_id)
            force = reset = False  # a retry resumes from the checkpoint
            # `tries` bounds the loop even when the shard failed before it could count an
            # attempt in status.json (then `attempts` would never grow).
            if plan.retry and attempts <= max_retries and tries <= max_retries:
                click.echo(f"{name}: failed (attempt {attempts}): {exc}", err=True)
                continue  # the last attempt's reason is said once, by _conclude
            return ShardOutcome(shard_id, problem=f"failed after {attempts} attempt(s): {exc}")
        click.echo(f"{name}: {_describe(report)}", err=True)
        for note in report.notes:
            click.echo(f"{name}: {note}", err=True)
        return ShardOutcome(shard_id, ok=True, stats=asdict(report))


def _describe(report: ShardReport) -> str:
    what = "already done, skipped" if report.skipped else f"done in {report.runtime_seconds:.1f}s"
    resumed = f", resumed after {report.resumed_rows}" if report.resumed_rows else ""
    # Batch outputs have no tokens until merge: say nothing rather than a misleading zero.
    tokens = report.input_tokens or report.output_tokens
    usage = f", tokens {report.input_tokens} in / {report.output_tokens} out" if tokens else ""
    return f"{what}: {report.rows_done} rows ({report.rows_failed} failed{resumed}){usage}"


def _stats_json(per_shard: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("rows_done", "rows_failed", "input_tokens", "output_tokens")
    return {
        "per_shard": per_shard,
        "aggregate": {
            "shards": len(per_shard),
            **{f"total_{k}": sum(int(r.get(k) or 0) for r in per_shard) for k in keys},
            "sum_runtime_seconds": round(
                sum(float(r.get("runtime_seconds") or 0.0) for r in per_shard), 3
            ),
        },
    }


# --- several shards, here or as parallel children ---------------------------------------------


def run_shards(
    cfg: MMirageConfig, config_path: Path, shards: list[int], plan: RunPlan, command: str
) -> list[ShardOutcome]:
    """Run ``shards`` one after another, or ``local_parallel_shards`` at a time as children
    (``mmirage COMMAND CONFIG --shard-id K``, which run the same ``run_one``)."""
    ep = cfg.execution_params
    width = ep.local_parallel_shards if ep.mode == "local" else 1
    if width <= 1 or len(shards) <= 1:
        return [run_one(cfg, k, plan) for k in shards]
    flags = (("--force-retry", plan.force_retry), ("--recompute", plan.recompute))
    extra = [flag for flag, on in flags if on]
    return _ParallelRun(cfg, config_path, command, extra, width).run(shards)


@dataclass
class _Child:
    shard_id: int
    proc: subprocess.Popen[bytes]
    stdout: list[bytes] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)


class _Console:
    """Lines from several shards, whole and one at a time; on a terminal, one status line kept
    below them (cleared before each line and drawn again after it)."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self._lock = threading.Lock()
        self._status = ""

    def line(self, text: str) -> None:
        with self._lock:
            self._clear()
            click.echo(text, err=True)
            self._draw()

    def status(self, text: str) -> None:
        if not self.live:
            return
        with self._lock:
            self._clear()
            self._status = text
            self._draw()

    def close(self) -> None:
        with self._lock:
            self._clear()
            self._status = ""

    def _clear(self) -> None:
        if self.live and self._status:
            sys.stderr.write("\r\033[K")

    def _draw(self) -> None:
        if self.live and self._status:
            sys.stderr.write(self._status)
            sys.stderr.flush()


class _ParallelRun:
    """Up to ``width`` child shard processes at a time; their outcomes, in shard order."""

    def __init__(
        self, cfg: MMirageConfig, config_path: Path, command: str, extra: list[str], width: int
    ) -> None:
        self.cfg = cfg
        self.config_path = config_path.resolve()
        self.command = command
        self.extra = extra
        self.width = width
        self.console = _Console()
        self.started = time.monotonic()
        self.rows_before = 0
        self._shown_at = 0.0

    def run(self, shards: list[int]) -> list[ShardOutcome]:
        waiting = list(shards)
        running: dict[int, _Child] = {}
        outcomes: dict[int, ShardOutcome] = {}
        self.rows_before = self._rows(shards)
        stopped_by_user_error = False
        try:
            while waiting or running:
                while waiting and len(running) < self.width and not stopped_by_user_error:
                    k = waiting.pop(0)
                    running[k] = self._spawn(k)
                for k, child in list(running.items()):
                    if child.proc.poll() is not None:
                        outcomes[k] = self._outcome(running.pop(k))
                        stopped_by_user_error |= outcomes[k].user_error
                if stopped_by_user_error and not running:
                    break
                self._show(shards, outcomes, running)
                time.sleep(0.2)
        except BaseException as exc:  # Ctrl-C, SIGTERM: stop the children, then go
            self._stop(running.values(), signalled=isinstance(exc, KeyboardInterrupt))
            raise
        finally:
            self.console.close()
        for k in waiting:
            outcomes[k] = ShardOutcome(k, problem="not started (stopped on a configuration error)")
        return [outcomes[k] for k in shards]

    def _argv(self, shard_id: int) -> list[str]:
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        return [
            sys.executable, "-m", "mmirage", "--log-level", level, self.command,
            str(self.config_path), "--shard-id", str(shard_id), "--stats", *self.extra,
        ]  # fmt: skip

    def _spawn(self, shard_id: int) -> _Child:
        from mmirage.core.shard.runner import current_run_id

        # One run id for all the children: batch receipts of this run share it.
        env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), "MMIRAGE_RUN_ID": current_run_id()}
        proc = subprocess.Popen(
            self._argv(shard_id), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        child = _Child(shard_id, proc)
        assert proc.stdout is not None and proc.stderr is not None
        child.readers = [
            threading.Thread(target=self._relay, args=(shard_id, proc.stderr), daemon=True),
            threading.Thread(target=self._collect, args=(proc.stdout, child.stdout), daemon=True),
        ]
        for reader in child.readers:
            reader.start()
        return child

    def _relay(self, shard_id: int, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.console.line(f"[shard {shard_id}] {text}")

    @staticmethod
    def _collect(stream: IO[bytes], into: list[bytes]) -> None:
        into.append(stream.read())

    def _outcome(self, child: _Child) -> ShardOutcome:
        for reader in child.readers:
            reader.join()
        code = child.proc.returncode
        stats = _child_stats(b"".join(child.stdout))
        if code == 0:
            return ShardOutcome(child.shard_id, ok=True, stats=stats)
        why = "stopped by a signal" if code < 0 else f"exit code {code}, see its lines above"
        return ShardOutcome(child.shard_id, stats=stats, problem=why, user_error=code == 2)

    def _rows(self, shards: list[int]) -> int:
        from mmirage.core.shard.state import read_status, status_path

        return sum(
            int((read_status(status_path(self.cfg, k)) or {}).get("rows_done") or 0) for k in shards
        )

    def _show(
        self, shards: list[int], outcomes: Mapping[int, ShardOutcome], running: Mapping[int, Any]
    ) -> None:
        # Once a second: it reads every shard's status.json.
        if not self.console.live or time.monotonic() - self._shown_at < 1.0:
            return
        self._shown_at = time.monotonic()
        ok = sum(o.ok for o in outcomes.values())
        rows = self._rows(shards)
        rate = max(0, rows - self.rows_before) / max(time.monotonic() - self.started, 1e-9)
        self.console.status(
            f"shards: {ok} done, {len(outcomes) - ok} failed, {len(running)} running, "
            f"{len(shards) - len(outcomes) - len(running)} waiting | {rows} rows, "
            f"{rate:.1f} rows/s"
        )

    @staticmethod
    def _stop(children: Iterable[_Child], *, signalled: bool) -> None:
        """Ctrl-C already reached the children (same process group): give them time to record
        "interrupted". Otherwise send SIGTERM. SIGKILL whoever is still there after the grace."""
        live = [c for c in children if c.proc.poll() is None]
        if not signalled:
            for child in live:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in live:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()


def _child_stats(output: bytes) -> dict[str, Any] | None:
    """The shard's report from a child's ``--stats`` JSON (``retry`` nests it under stats)."""
    try:
        doc = json.loads(output)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    per_shard = (doc.get("stats") or doc).get("per_shard") or []
    return per_shard[0] if per_shard and isinstance(per_shard[0], dict) else None


def _conclude(outcomes: list[ShardOutcome], stats: bool) -> None:
    """Print --stats, then end with exit 2 (a child hit a user error) or 1 if any shard did
    not succeed, naming them and why (conflicts included, so none scrolls out of sight)."""
    if stats:
        reports = [o.stats for o in outcomes if o.stats is not None]
        click.echo(json.dumps(_stats_json(reports), indent=2))
    bad = [o for o in outcomes if not o.ok]
    if not bad:
        _fail_on_failed_rows(outcomes)
        return
    for o in bad:
        click.echo(f"shard {o.shard_id}: {o.problem}", err=True)
    ids = [o.shard_id for o in bad]
    code = 2 if any(o.user_error for o in bad) else 1
    _fail(f"{len(bad)} of {len(outcomes)} shard(s) did not succeed: {ids}", code)


def _fail_on_failed_rows(outcomes: list[ShardOutcome]) -> None:
    """Every shard finished, but a row that failed is work that failed: exit 1, naming one."""
    reports = [o.stats for o in outcomes if o.stats]
    failed = sum(int(r.get("rows_failed") or 0) for r in reports)
    if not failed:
        return
    first = next((r["first_row_error"] for r in reports if r.get("first_row_error")), None)
    example = f" (first: {first})" if first else ""
    retryable = sum(int(r.get("rows_retryable") or 0) for r in reports)
    hint = (
        f"; 'mmirage retry CONFIG' computes again the {retryable} that failed for a retryable "
        "reason"
        if retryable
        else ""
    )
    _fail(
        f"{failed} row(s) failed{example}; each is published with its reason in __errors__{hint}",
        1,
    )


@click.command("run")
@_config_params
@click.option("--shard-id", type=click.IntRange(min=0), default=None, help="Run only this shard.")
@click.option(
    "--force-retry",
    is_flag=True,
    help="Retry shards that did not succeed, even when out of retries, and the rows that failed "
    "for a retryable reason (finished rows are kept).",
)
@click.option(
    "--recompute",
    is_flag=True,
    help="Discard the shards' results and compute them again (pays for every row again).",
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
    help="batch_api: after submitting, wait for the batches and merge into --output-path.",
)
@click.option(
    "--output-path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="With --wait: the merged JSONL file.",
)
def run(
    config: Path | None,
    config_option: Path | None,
    shard_id: int | None,
    force_retry: bool,
    recompute: bool,
    stats: bool,
    export_prompts: str | None,
    wait: bool,
    output_path: Path | None,
) -> None:
    """Run the pipeline's shards here; finished ones are skipped.

    Without --shard-id: loading_params.shard_id if the file sets one, else every shard,
    execution_params.local_parallel_shards at a time. An interrupted shard resumes at its last
    checkpoint. With execution_params.retry (or --force-retry) a failed shard is retried up to
    max_retries times.
    """
    path = _config_path(config, config_option)
    with _user_errors_exit_2():
        cfg = _load(path)
    lp, ep = cfg.loading_params, cfg.execution_params
    if shard_id is not None and shard_id >= lp.num_shards:
        _fail(f"--shard-id {shard_id} is out of range: num_shards is {lp.num_shards}", 2)
    chosen = shard_id if shard_id is not None else lp.shard_id
    shards = [chosen] if chosen is not None else list(range(lp.num_shards))
    batch = has_batch_api(cfg)
    if ep.mode == "slurm" and shard_id is None and export_prompts is None:
        # The shards run as SLURM array tasks, each `mmirage run CONFIG --shard-id K` (here).
        from mmirage.slurm_cli import run_on_slurm

        if wait and batch and output_path is None:
            _fail("--wait with a batch_api processor needs --output-path FILE.jsonl", 2)
        follow = wait or ep.retry or ep.merge or force_retry
        sys.exit(run_on_slurm(cfg, path, follow=follow, batch_output=output_path))
    if wait and (not batch or output_path is None):
        _fail("--wait needs a batch_api processor and --output-path FILE.jsonl", 2)
    _share_run_id()
    _sigterm_as_exit(ep.signal_grace_seconds)
    _die_with_parent()
    plan = RunPlan(
        retry=ep.retry or force_retry,
        force_retry=force_retry,
        recompute=recompute,
        retry_rows=force_retry,
    )
    if export_prompts is not None:
        _conclude(_export_prompts(cfg, shards, plan, export_prompts), stats)
        return
    with _user_errors_exit_2():
        _check_dirs(cfg)
    outcomes = run_shards(cfg, path, shards, plan, "run")
    if wait and output_path is not None and all(o.ok for o in outcomes):
        # Submitted: wait and merge whatever happened to the rows and batches (merge keeps
        # every row, failed ones with their reason), then exit with the worst code.
        from mmirage.batch_cli import batch_check, batch_merge

        codes = [batch_check(cfg, path, wait=True), batch_merge(cfg, output_path, wait=True)]
        try:
            _conclude(outcomes, stats)
        except SystemExit as exc:
            codes.append(int(exc.code or 0))
        sys.exit(max(codes))
    _conclude(outcomes, stats)
    if ep.merge and len(shards) == lp.num_shards and not batch:
        # The whole pipeline ran here: merge it, as `mmirage merge CONFIG` would.
        merge_after_run(cfg)


def _share_run_id() -> None:
    """One run id for this invocation, inherited by the shard processes it starts (their
    receipts and exports then share it)."""
    from mmirage.core.shard.runner import current_run_id

    os.environ["MMIRAGE_RUN_ID"] = current_run_id()


def _export_prompts(
    cfg: MMirageConfig, shards: list[int], plan: RunPlan, export_path: str
) -> list[ShardOutcome]:
    """The dry run: shards run here, one after another, on a throwaway copy of their state
    (nothing a real run would trust), and the requests land in the export file."""
    import tempfile

    from mmirage.core.process.batch.dry_run import check_dry_run_allowed, dry_run_config
    from mmirage.core.process.batch.processor import export_file
    from mmirage.core.shard.runner import current_run_id

    target = export_file(export_path, current_run_id())
    with _user_errors_exit_2():
        check_dry_run_allowed(cfg, target, export_path)
    with tempfile.TemporaryDirectory(prefix="mmirage-dry-run-") as tmp:
        dry = dry_run_config(cfg, Path(tmp))
        plan = replace(plan, retry=False, export_prompts=export_path)
        outcomes = [run_one(dry, k, plan) for k in shards]
    if all(o.ok for o in outcomes):
        click.echo(f"exported the requests to {target}", err=True)
    return outcomes


@click.command("retry")
@_config_params
@click.option("--shard-id", type=click.IntRange(min=0), default=None, help="Retry only this shard.")
@click.option("--stats", is_flag=True, help="Add the retried shards' statistics to the JSON.")
@click.option("-y", "--yes", is_flag=True, help="slurm mode: resubmit without asking.")
@click.option(
    "--only-retryable",
    is_flag=True,
    help="batch_api: resubmit only requests whose error the provider marks retryable.",
)
def retry(
    config: Path | None,
    config_option: Path | None,
    shard_id: int | None,
    stats: bool,
    yes: bool,
    only_retryable: bool,
) -> None:
    """Rerun the shards that did not succeed (failed, dead while running, or never run), and
    in finished shards the rows that failed for a retryable reason (only their failed outputs
    are requested again).

    Each gets at most execution_params.max_retries retries in all (status.json counts its
    attempts); succeeded shards are skipped. Prints the summary JSON; exits 0 only when every
    shard has succeeded. With a batch_api processor, then resubmits the requests that failed,
    expired, were canceled or are missing from ended batches (a later merge takes them).
    """
    from mmirage.core.shard.health import PARTIAL
    from mmirage.core.shard.state import EXHAUSTED, FAILED, MISSING, STALE, UNKNOWN

    path = _config_path(config, config_option)
    with _user_errors_exit_2():
        cfg = _load(path)
    n = cfg.loading_params.num_shards
    if shard_id is not None and shard_id >= n:
        _fail(f"--shard-id {shard_id} is out of range: num_shards is {n}", 2)
    if cfg.execution_params.mode == "slurm" and shard_id is None:
        from mmirage.slurm_cli import retry_on_slurm

        sys.exit(retry_on_slurm(cfg, path, yes, only_retryable))
    states = _states(cfg, path)
    chosen = [shard_id] if shard_id is not None else list(range(n))
    todo = [k for k in chosen if states[k] in (FAILED, STALE, MISSING, UNKNOWN, PARTIAL)]
    for k in chosen:
        if states[k] == EXHAUSTED:
            click.echo(
                f"shard {k}/{n}: out of retries; 'mmirage run --force-retry' resets", err=True
            )
    _sigterm_as_exit(cfg.execution_params.signal_grace_seconds)
    _die_with_parent()
    outcomes: list[ShardOutcome] = []
    if todo:
        with _user_errors_exit_2():
            _check_dirs(cfg)
        outcomes = run_shards(cfg, path, todo, RunPlan(retry=True, retry_rows=True), "retry")
    summary = _summary(_states(cfg, path), chosen)
    if stats:
        summary["stats"] = _stats_json([o.stats for o in outcomes if o.stats is not None])
    click.echo(json.dumps(summary, indent=2))
    if any(o.user_error for o in outcomes):
        _fail("a shard stopped on a configuration problem (see above)", 2)
    if summary["successful"] != summary["total"]:
        _fail(f"{summary['total'] - summary['successful']} shard(s) have not succeeded", 1)
    if has_batch_api(cfg):
        from mmirage.batch_cli import batch_retry

        sys.exit(batch_retry(cfg, only_retryable))
    if not todo:
        click.echo("All shards already succeeded.", err=True)


def _states(cfg: MMirageConfig, path: Path) -> dict[int, str]:
    from mmirage.core.shard.health import shard_health

    return {k: shard_health(cfg, k, path).state for k in range(cfg.loading_params.num_shards)}


def _summary(states: Mapping[int, str], shards: list[int]) -> dict[str, Any]:
    """The original's retry/check summary: total, successful, running, failed (everything
    else but exhausted), max_retries_exceeded."""
    from mmirage.core.shard.state import EXHAUSTED, RUNNING, SUCCESS

    picked = [states[k] for k in shards]
    counts = {s: picked.count(s) for s in (SUCCESS, RUNNING, EXHAUSTED)}
    return {
        "total": len(picked),
        "successful": counts[SUCCESS],
        "running": counts[RUNNING],
        "failed": len(picked) - sum(counts.values()),
        "max_retries_exceeded": counts[EXHAUSTED],
    }


# --- check -----------------------------------------------------------------------------------

_CHECK_HEADER = ("SHARD", "STATUS", "ATTEMPTS", "ROWS", "FAILED", "HEARTBEAT", "ERROR")


def _age(moment: Any) -> str:
    """How long ago an ISO timestamp was, in one short unit ("12s", "5m", "3h", "2d")."""
    from mmirage.core.shard.state import parse_iso

    when = parse_iso(moment)
    if when is None:
        return "-"
    seconds = max(0, int(time.time() - when))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _check_row(shard_id: int, state: str, status: Mapping[str, Any], budget: int) -> list[str]:
    error = " ".join(str(status.get("error") or "").split())
    return [
        str(shard_id),
        state,
        f"{int(status.get('attempts') or 0)}/{budget}",
        str(int(status.get("rows_done") or 0)),
        str(int(status.get("rows_failed") or 0)),
        _age(status.get("heartbeat")) if status else "-",
        error if len(error) <= 100 else error[:99] + "…",
    ]


@click.command("check")
@_config_params
@click.option(
    "--metadata-path",
    "metadata_paths",
    multiple=True,
    help="batch_api configs: a receipt file to check (repeatable) [default: the config's].",
)
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
    """
    from mmirage.core.shard.health import shard_health
    from mmirage.core.shard.state import SUCCESS

    path = _config_path(config, config_option)
    with _user_errors_exit_2():
        cfg = _load(path)
    if has_batch_api(cfg):
        from mmirage.batch_cli import batch_check

        sys.exit(batch_check(cfg, path, metadata_paths, wait, poll_interval))
    if metadata_paths or wait or poll_interval is not None:
        _fail("--metadata-path, --wait and --poll-interval apply to batch_api configs only", 2)
    if cfg.execution_params.mode == "slurm" and (retry_failed or shutil.which("sbatch")):
        # Without SLURM here (say, on a laptop holding the state folder) the plain table below.
        from mmirage.slurm_cli import check_on_slurm

        sys.exit(check_on_slurm(cfg, path, retry_failed, yes))
    if retry_failed:
        _fail("--retry resubmits SLURM tasks (mode: slurm); here run 'mmirage retry CONFIG'", 2)
    n, max_retries = cfg.loading_params.num_shards, cfg.execution_params.max_retries
    lines = [list(_CHECK_HEADER)]
    counts: dict[str, int] = {}
    rows = failed = 0
    notes: list[str] = []  # in full: the table cuts long errors
    for k in range(n):
        health = shard_health(cfg, k, path)
        counts[health.state] = counts.get(health.state, 0) + 1
        lines.append(_check_row(k, health.state, health.status, max_retries + 1))
        rows += int(health.status.get("rows_done") or 0)
        failed += int(health.status.get("rows_failed") or 0)
        notes += health.notes
    _print_table(lines)
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    click.echo(f"{n} shard(s): {summary}; {rows} rows done, {failed} failed")
    for line in notes:
        click.echo(line, err=True)
    sys.exit(0 if counts.get(SUCCESS, 0) == n else 1)


COMMANDS = (run, retry, check)
