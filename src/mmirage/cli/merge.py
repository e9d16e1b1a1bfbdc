"""``mmirage merge``, ``mmirage merge-dir`` and ``mmirage stats``.

Exit codes: 0 done; 1 shards missing (or unreadable); 2 a configuration or usage error, or an
output path that cannot be written (a file in the way, no permission). The merge logic lives in
``mmirage.core.merge.shards`` (for batch_api configs, ``mmirage.cli.batch_mode``), imported
inside the commands so that ``mmirage --help`` does not load pyarrow or datasets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mmirage.cli.errors import exit_on_errors, os_failure
from mmirage.cli.merge_report import report
from mmirage.cli.options import config_params, config_path, load, metadata_paths_option

# Both merge commands write their result the same ways.
_ALLOW_PARTIAL = click.option(
    "--allow-partial", is_flag=True, help="Merge even if some shards are missing."
)
_FORMAT = click.option(
    "--format",
    "fmt",
    type=click.Choice(["hf", "jsonl", "parquet"], case_sensitive=False),
    default="hf",
    show_default=True,
    help="hf: a datasets save_to_disk directory (the original's format), or one file.",
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
@_ALLOW_PARTIAL
@_FORMAT
@click.option(
    "--output-path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="batch_api configs: the single ordered JSONL file the results are merged into.",
)
@metadata_paths_option("read")
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

    CONFIG is the pipeline's YAML file (or give it as --config CONFIG).
    """
    from mmirage.cli.results import MergeRequest, results_for
    from mmirage.rundir import RunDir

    with exit_on_errors():
        cfg = load(config_path(config, config_option))
        request = MergeRequest(output_root, allow_partial, fmt, output_path, metadata_paths, wait)
        sys.exit(results_for(cfg).merge(cfg, RunDir.of(cfg), request))


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
@_ALLOW_PARTIAL
@_FORMAT
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
    from mmirage.core.merge.shards import merge_dir

    source = directory or input_dir  # the original spelled it --input-dir
    if source is None:
        raise click.UsageError("give the directory: mmirage merge-dir DIRECTORY")
    with exit_on_errors():
        try:
            results = merge_dir(source, output, fmt.lower(), allow_partial)  # type: ignore[arg-type]
        except OSError as exc:
            os_failure(exc, "--output" if output else "merge output")
    report(results)


@click.command("stats")
@config_params
def stats(config: Path | None, config_option: Path | None) -> None:
    """Print the shards' statistics as JSON: per shard, then aggregated.

    CONFIG is the pipeline's YAML file (or give it as --config CONFIG).
    """
    from mmirage.core.merge.shards import stats_report
    from mmirage.core.shard.state import MISSING, never_ran
    from mmirage.errors import WorkFailed
    from mmirage.rundir import RunDir

    path = config_path(config, config_option)
    with exit_on_errors():
        cfg = load(path)
        stats = stats_report(cfg, RunDir.of(cfg))
        if all(entry["state"] == MISSING for entry in stats["per_shard"]):
            raise WorkFailed(never_ran(path))
    click.echo(json.dumps(stats, indent=2, default=str))
