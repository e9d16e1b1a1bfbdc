"""``mmirage merge``, ``mmirage merge-dir`` and ``mmirage stats``.

Exit codes: 0 done; 1 shards missing (or unreadable); 2 a configuration or usage error, or an
output path that cannot be written (a file in the way, no permission). The merge logic lives in
``mmirage.core.merge.shards``, imported inside the commands so that ``mmirage --help`` does not
load pyarrow or datasets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mmirage.cli_support import (
    config_params,
    config_path,
    fail,
    has_batch_api,
    load,
    os_failure,
    user_errors_exit_2,
)

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig
    from mmirage.core.merge.shards import MergeResult

_FORMAT = click.Choice(["hf", "jsonl", "parquet"], case_sensitive=False)
_FORMAT_HELP = "hf: a datasets save_to_disk directory (the original's format), or one file."


def _report(results: list[MergeResult]) -> None:
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


def merge_after_run(cfg: MMirageConfig) -> None:
    """What ``mmirage merge CONFIG`` does, with its exit codes."""
    from mmirage.core.merge.shards import MergeError, merge_config

    try:
        with user_errors_exit_2():
            results = merge_config(cfg)
    except MergeError as exc:
        fail(str(exc), 1)
    except OSError as exc:
        os_failure(exc, "merge output")
    for result in results:
        click.echo(
            f"merged {result.rows} rows ({result.rows_failed} failed) into {result.output}",
            err=True,
        )


@click.command("merge")
@config_params
@click.option(
    "--output-root",
    "--output-dir",
    "output_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write dataset D to ROOT/<name of D's output_dir> [default: <output_dir>/merged].",
)
@click.option("--allow-partial", is_flag=True, help="Merge even if some shards are missing.")
@click.option("--format", "fmt", type=_FORMAT, default="hf", show_default=True, help=_FORMAT_HELP)
@click.option(
    "--output-path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="batch_api configs: the single ordered JSONL file the results are merged into.",
)
@click.option(
    "--metadata-path",
    "metadata_paths",
    multiple=True,
    help="batch_api configs: a receipt file to read (repeatable) [default: the config's].",
)
@click.option("--wait", is_flag=True, help="batch_api configs: wait until every batch ends.")
def merge(
    config: Path | None,
    config_option: Path | None,
    output_root: Path | None,
    allow_partial: bool,
    fmt: str,
    output_path: Path | None,
    metadata_paths: tuple[str, ...],
    wait: bool,
) -> None:
    """Merge each dataset's published shards, in order, into one dataset.

    Refuses a dataset with missing shards (exit 1) unless --allow-partial. With a batch_api
    processor: fetch the finished batches and rebuild the rows into --output-path (one ordered
    JSONL file), reporting what succeeded, failed, expired or is still running.
    """
    from mmirage.core.merge.shards import MergeError, merge_config

    with user_errors_exit_2():
        cfg = load(config_path(config, config_option))
    if has_batch_api(cfg):
        if output_path is None:
            fail("this config has a batch_api processor: give --output-path FILE.jsonl", 2)
        from mmirage.batch_cli import batch_merge

        sys.exit(batch_merge(cfg, output_path, metadata_paths, wait))
    if output_path is not None or metadata_paths or wait:
        fail("--output-path, --metadata-path and --wait apply to batch_api configs only", 2)
    try:
        results = merge_config(
            cfg,
            output_root=output_root,
            fmt=fmt.lower(),  # type: ignore[arg-type]  # click.Choice checked it
            allow_partial=allow_partial,
        )
    except MergeError as exc:
        fail(str(exc), 1)
    except OSError as exc:
        os_failure(exc, "--output-root" if output_root else "merge output")
    _report(results)


@click.command("merge-dir")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path), required=False)
@click.option(
    "--input-dir", "input_dir", type=click.Path(file_okay=False, path_type=Path), hidden=True
)
@click.option(
    "--output",
    "--output-dir",
    "output",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to write [default: DIRECTORY/merged].",
)
@click.option("--allow-partial", is_flag=True, help="Merge even if some shards are missing.")
@click.option("--format", "fmt", type=_FORMAT, default="hf", show_default=True, help=_FORMAT_HELP)
def merge_dir_command(
    directory: Path | None,
    input_dir: Path | None,
    output: Path | None,
    allow_partial: bool,
    fmt: str,
) -> None:
    """Merge the shards found in DIRECTORY (HF directories, .parquet or .jsonl files).

    If DIRECTORY holds no shards, each subdirectory that does is merged to OUTPUT/<subdir>.
    """
    from mmirage.core.merge.shards import MergeError, merge_dir

    source = directory or input_dir  # the original spelled it --input-dir
    if source is None:
        raise click.UsageError("give the directory: mmirage merge-dir DIRECTORY")
    try:
        results = merge_dir(source, output, fmt.lower(), allow_partial)  # type: ignore[arg-type]
    except MergeError as exc:
        fail(str(exc), 1)
    except OSError as exc:
        os_failure(exc, "--output" if output else "merge output")
    _report(results)


@click.command("stats")
@config_params
def stats(config: Path | None, config_option: Path | None) -> None:
    """Print the shards' statistics as JSON: per shard, then aggregated."""
    from mmirage.core.merge.shards import stats_report

    with user_errors_exit_2():
        cfg = load(config_path(config, config_option))
    click.echo(json.dumps(stats_report(cfg), indent=2, default=str))


COMMANDS = (merge, merge_dir_command, stats)
