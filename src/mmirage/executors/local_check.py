"""``mmirage check`` for shards run here: every shard's state as a table, then a summary."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mmirage.executors.console import print_table

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.rundir import RunDir

CHECK_HEADER = ("SHARD", "STATUS", "ATTEMPTS", "ROWS", "FAILED", "HEARTBEAT", "ERROR")


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


def check_table(cfg: MMirageConfig, run_dir: RunDir, path: Path) -> int:
    """Print the table, the summary and the shards' notes; 0 only when all succeeded."""
    from mmirage.core.shard.health import shard_health
    from mmirage.core.shard.report import failed_summary
    from mmirage.core.shard.state import MISSING, SUCCESS, never_ran

    n, max_retries = cfg.loading_params.num_shards, cfg.execution_params.max_retries
    lines = [list(CHECK_HEADER)]
    counts: dict[str, int] = {}
    rows = failed = retryable = 0
    notes: list[str] = []  # in full: the table cuts long errors
    for k in range(n):
        health = shard_health(cfg, run_dir, k, path)
        counts[health.state] = counts.get(health.state, 0) + 1
        lines.append(_check_row(k, health.state, health.status, max_retries + 1))
        rows += int(health.status.get("rows_done") or 0)
        failed += int(health.status.get("rows_failed") or 0)
        retryable += int(health.status.get("rows_retryable") or 0)
        notes += health.notes
    print_table(lines)
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    click.echo(f"{n} shard(s): {summary}; {rows} rows done, {failed_summary(failed, retryable)}")
    if counts.get(MISSING) == n:
        notes.append(never_ran(path))
    for line in notes:
        click.echo(line, err=True)
    return 0 if counts.get(SUCCESS, 0) == n else 1
