"""What every mmirage command shares: the config argument, loading it, the pipeline's kind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

CONFIG_FILE = click.Path(dir_okay=False, path_type=Path)


def config_path(argument: Path | None, option: Path | None) -> Path:
    command = click.get_current_context().command_path
    if argument and option and argument != option:
        raise click.UsageError(
            f"two configuration files ({argument} and --config {option}): give one"
        )
    path = argument or option
    if path is None:
        raise click.UsageError(
            f"give the configuration file: {command} CONFIG (or {command} --config CONFIG)"
        )
    return path


def load(path: Path) -> MMirageConfig:
    from mmirage.config import load_mmirage_config

    return load_mmirage_config(path)


def config_params(command: Callable[..., Any]) -> Callable[..., Any]:
    # `--config PATH` is the original's spelling, kept so its scripts run unchanged.
    command = click.argument("config", type=CONFIG_FILE, required=False)(command)
    return click.option(
        "--config",
        "config_option",
        type=CONFIG_FILE,
        default=None,
        metavar="CONFIG",
        help="The pipeline's YAML file, as an option instead of the CONFIG argument.",
    )(command)


def metadata_paths_option(verb: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--metadata-path`` (repeatable) of the batch_api commands; ``verb`` says what they do
    with each receipt file."""
    return click.option(
        "--metadata-path",
        "metadata_paths",
        multiple=True,
        metavar="PATH",
        help=f"batch_api configs: a receipt file to {verb} (repeatable) [default: the config's].",
    )
