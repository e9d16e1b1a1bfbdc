"""What a merge of shards prints, and the merge that ends a run (``execution_params.merge``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from mmirage.cli.errors import os_failure

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.core.merge.shards import MergeResult
    from mmirage.rundir import RunDir


def report(results: list[MergeResult]) -> None:
    for r in results:
        partial = f", shard(s) {r.missing} missing" if r.missing else ""
        click.echo(
            f"{r.name}: {len(r.shards)} shard(s){partial}, {r.rows} rows ({r.rows_failed} "
            f"failed), tokens {r.input_tokens} in / {r.output_tokens} out -> {r.output}"
        )
        if r.json_columns:
            click.echo(
                f"  note: column(s) {r.json_columns} mix value types; written as JSON text",
                err=True,
            )
    if len(results) > 1:
        rows = sum(r.rows for r in results)
        failed = sum(r.rows_failed for r in results)
        tin = sum(r.input_tokens for r in results)
        tout = sum(r.output_tokens for r in results)
        click.echo(
            f"total: {len(results)} datasets, {rows} rows ({failed} failed), "
            f"tokens {tin} in / {tout} out"
        )


def merge_after_run(cfg: MMirageConfig, run_dir: RunDir) -> None:
    """What ``mmirage merge CONFIG`` does, with its exit codes."""
    from mmirage.core.merge.shards import merge_config

    try:
        results = merge_config(cfg, run_dir)
    except OSError as exc:
        os_failure(exc, "merge output")
    for result in results:
        click.echo(
            f"merged {result.rows} rows ({result.rows_failed} failed) into {result.output}",
            err=True,
        )
