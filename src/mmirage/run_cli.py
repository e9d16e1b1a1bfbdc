"""``mmirage run`` and ``mmirage check``: run shards locally, report their state.

Exit codes: 0 every shard succeeded; 1 some work failed; 2 a problem the user must fix
(configuration, data path, missing API key, a shard held by another process or computed with
another configuration). Heavy modules are imported inside the commands so ``mmirage --help``
stays fast.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.core.shard.runner import ShardReport

CONFIG_FILE = click.Path(dir_okay=False, path_type=Path)


def _user_errors() -> tuple[type[BaseException], ...]:
    from llm_kit.errors import ConfigError as KitConfigError  # missing API key, bad options
    from mmirage.config.errors import ConfigError
    from mmirage.core.loader import DataError
    from mmirage.core.shard.state import ShardConflictError

    return (ConfigError, DataError, ShardConflictError, KitConfigError)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@contextmanager
def _user_errors_exit_2() -> Iterator[None]:
    """A user's error becomes one sentence and exit 2 (with a traceback at DEBUG)."""
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, _user_errors()) or logging.getLogger().isEnabledFor(logging.DEBUG):
            raise
        _fail(str(exc), 2)


def _config_path(argument: Path | None, option: Path | None) -> Path:
    path = argument or option
    if path is None:
        raise click.UsageError("give the configuration file: mmirage COMMAND CONFIG")
    return path


def _load(path: Path) -> MMirageConfig:
    from mmirage.config import load_mmirage_config

    return load_mmirage_config(path)


def _config_params(command: Callable[..., Any]) -> Callable[..., Any]:
    # The original spelled it --config PATH; both forms work.
    command = click.argument("config", type=CONFIG_FILE, required=False)(command)
    return click.option("--config", "config_option", type=CONFIG_FILE, default=None, hidden=True)(
        command
    )


def _sigterm_as_exit() -> None:
    # SIGTERM (SLURM, kill) unwinds like Ctrl-C, so the shard records "failed", not "running".
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


@click.command("run")
@_config_params
@click.option("--shard-id", type=click.IntRange(min=0), default=None, help="Run only this shard.")
@click.option(
    "--force-retry",
    is_flag=True,
    help="Retry shards that did not succeed, even when out of retries (finished shards are kept).",
)
@click.option(
    "--recompute",
    is_flag=True,
    help="Discard the shards' results and compute them again (pays for every row again).",
)
@click.option("--stats", is_flag=True, help="Print the shards' statistics as JSON on stdout.")
def run(
    config: Path | None,
    config_option: Path | None,
    shard_id: int | None,
    force_retry: bool,
    recompute: bool,
    stats: bool,
) -> None:
    """Run the pipeline's shards here, one after another.

    Without --shard-id: loading_params.shard_id if the file sets one, else every shard. A
    finished shard is skipped; an interrupted one resumes at its last checkpoint. With
    execution_params.retry (or --force-retry) a failed shard is retried up to max_retries times.
    """
    from mmirage.core.shard import run_shard, shard_state, status_path
    from mmirage.core.shard.state import EXHAUSTED, read_status

    with _user_errors_exit_2():
        cfg = _load(_config_path(config, config_option))
    lp, ep = cfg.loading_params, cfg.execution_params
    if shard_id is not None and shard_id >= lp.num_shards:
        _fail(f"--shard-id {shard_id} is out of range: num_shards is {lp.num_shards}", 2)
    chosen = shard_id if shard_id is not None else lp.shard_id
    shards = [chosen] if chosen is not None else list(range(lp.num_shards))
    retry = ep.retry or force_retry
    _sigterm_as_exit()
    reports: list[ShardReport] = []
    failed: list[int] = []
    for k in shards:
        name = f"shard {k}/{lp.num_shards}"
        state = shard_state(read_status(status_path(cfg, k)), ep.max_retries)
        if retry and state == EXHAUSTED and not force_retry:
            click.echo(f"{name}: out of retries; rerun with --force-retry", err=True)
            failed.append(k)
            continue
        force, reset = recompute, force_retry
        tries = 0
        while True:
            tries += 1
            try:
                with _user_errors_exit_2():
                    report = run_shard(cfg, k, force=force, reset_attempts=reset)
            except Exception as exc:
                if logging.getLogger().isEnabledFor(logging.DEBUG):
                    logging.getLogger(__name__).exception("%s failed", name)
                attempts = int((read_status(status_path(cfg, k)) or {}).get("attempts") or 0)
                click.echo(f"{name}: failed (attempt {attempts}): {exc}", err=True)
                force = reset = False  # a retry resumes from the checkpoint
                # `tries` bounds the loop even when the shard failed before it could count an
                # attempt in status.json (then `attempts` would never grow).
                if retry and attempts <= ep.max_retries and tries <= ep.max_retries:
                    continue
                failed.append(k)
                break
            reports.append(report)
            click.echo(f"{name}: {_describe(report)}", err=True)
            break
    if stats:
        click.echo(json.dumps(_stats_json(reports), indent=2))
    if failed:
        _fail(f"{len(failed)} of {len(shards)} shard(s) failed: {failed}", 1)
    if ep.merge and len(shards) == lp.num_shards:
        # The whole pipeline ran here: merge it, as `mmirage merge CONFIG` would.
        from mmirage.core.writer.merge import merge_config

        with _user_errors_exit_2():
            for result in merge_config(cfg):
                click.echo(
                    f"merged {result.rows} rows ({result.rows_failed} failed) into {result.output}",
                    err=True,
                )


def _describe(report: ShardReport) -> str:
    what = "already done, skipped" if report.skipped else f"done in {report.runtime_seconds:.1f}s"
    resumed = f", resumed after {report.resumed_rows}" if report.resumed_rows else ""
    return (
        f"{what}: {report.rows_done} rows ({report.rows_failed} failed{resumed}), tokens "
        f"{report.input_tokens} in / {report.output_tokens} out"
    )


def _stats_json(reports: list[ShardReport]) -> dict[str, Any]:
    keys = ("rows_done", "rows_failed", "input_tokens", "output_tokens")
    return {
        "per_shard": [asdict(r) for r in reports],
        "aggregate": {
            "shards": len(reports),
            **{f"total_{k}": sum(getattr(r, k) for r in reports) for k in keys},
            "sum_runtime_seconds": round(sum(r.runtime_seconds for r in reports), 3),
        },
    }


@click.command("check")
@_config_params
def check(config: Path | None, config_option: Path | None) -> None:
    """Show every shard's state; exit 0 only when all succeeded."""
    from mmirage.core.shard.state import (
        RUNNING,
        STALE,
        SUCCESS,
        read_status,
        shard_state,
        status_path,
    )

    with _user_errors_exit_2():
        cfg = _load(_config_path(config, config_option))
    n, max_retries = cfg.loading_params.num_shards, cfg.execution_params.max_retries
    header = ("SHARD", "STATE", "ATTEMPTS", "ROWS", "FAILED", "IN_TOKENS", "OUT_TOKENS", "NOTE")
    lines: list[tuple[str, ...]] = [header]
    counts: dict[str, int] = {}
    for k in range(n):
        status = read_status(status_path(cfg, k))
        state = shard_state(status, max_retries)
        counts[state] = counts.get(state, 0) + 1
        s = status or {}
        alive = state in (RUNNING, STALE)
        note = s.get("error") or (f"heartbeat {s.get('heartbeat')}" if alive else "")
        counters = [s.get(c, 0) for c in ("attempts", "rows_done", "rows_failed")]
        counters += [s.get("input_tokens", 0), s.get("output_tokens", 0)]
        lines.append((str(k), state, *map(str, counters), str(note or "")[:100]))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    for line in lines:
        padded = [v.ljust(w) for v, w in zip(line, widths, strict=False)]
        click.echo("  ".join([*padded, line[-1]]).rstrip())
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    click.echo(f"{n} shard(s): {summary}")
    sys.exit(0 if counts.get(SUCCESS, 0) == n else 1)


COMMANDS = (run, check)
