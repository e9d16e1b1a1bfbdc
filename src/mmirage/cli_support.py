"""What every mmirage command shares: the config argument, loading it, and turning a user's
error into one sentence with exit code 2 (a failure of the work is exit 1)."""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

CONFIG_FILE = click.Path(dir_okay=False, path_type=Path)


def user_errors() -> tuple[type[BaseException], ...]:
    from llm_kit.errors import ConfigError as KitConfigError  # missing API key, bad options
    from mmirage.config.errors import ConfigError
    from mmirage.core.loader import DataError
    from mmirage.core.process.batch.adapter import MissingCredentialsError
    from mmirage.core.process.batch.registry import UnknownBatchAdapterError
    from mmirage.core.process.batch.spool import OversizedRequestError
    from mmirage.core.shard.state import UnusableDirError

    return (
        ConfigError,
        DataError,
        UnusableDirError,
        KitConfigError,
        MissingCredentialsError,
        UnknownBatchAdapterError,
        OversizedRequestError,
    )


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def debug() -> bool:
    return logging.getLogger().isEnabledFor(logging.DEBUG)


@contextmanager
def user_errors_exit_2() -> Iterator[None]:
    """A user's error becomes one sentence and exit 2 (with a traceback at DEBUG)."""
    try:
        yield
    except Exception as exc:
        if not isinstance(exc, user_errors()):
            raise
        if debug():
            logging.getLogger(__name__).exception("the traceback (--log-level DEBUG)")
        fail(str(exc), 2)


def os_failure(exc: OSError, field: str) -> NoReturn:
    """A path the user must fix exits 2 naming it (``field``: the option that chose it); any
    other OS error (disk full, I/O) is a failed merge, exit 1."""
    from mmirage.core.shard.state import is_path_problem, unusable_dir

    if is_path_problem(exc):
        fail(str(unusable_dir(exc, Path(exc.filename or "."), field)), 2)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = exc.filename or f"the {field}"
        fail(
            f"no space left on the device of {where}; free space there or choose another {field}",
            1,
        )
    fail(str(exc), 1)


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


def has_batch_api(cfg: MMirageConfig) -> bool:
    """Batch mode: check, merge and retry follow provider batches instead of shards."""
    return any(p.type == "batch_api" for p in cfg.processors)


def print_table(lines: list[list[str]]) -> None:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    for line in lines:
        padded = [v.ljust(w) for v, w in zip(line, widths, strict=False)]
        click.echo("  ".join([*padded, line[-1]]).rstrip())
