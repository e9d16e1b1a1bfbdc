"""The ``mmirage`` command line. Exit codes: 0 ok, 1 the work failed, 2 usage or config error,
130 stopped by Ctrl-C, 143 stopped by SIGTERM."""

from __future__ import annotations

import importlib
import logging
from typing import NoReturn

import click

from mmirage.cli.process_exit import exit_without_teardown

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

# Command name -> "module:attribute". A command's module is imported only when that command
# runs (or --help lists it): importing all of them cost every command ~60 ms.
COMMANDS = {
    "check": "mmirage.cli.retry_check:check",
    "emulate": "mmirage.cli.emulate:emulate",
    "job": "mmirage.cli.job:job",
    "merge": "mmirage.cli.merge:merge",
    "merge-dir": "mmirage.cli.merge:merge_dir_command",
    "retry": "mmirage.cli.retry_check:retry",
    "run": "mmirage.cli.run:run",
    "stats": "mmirage.cli.merge:stats",
    "submit": "mmirage.cli.slurm:submit",
    "view": "mmirage.cli.view:view",
}


# Ctrl-C: what a run finished stays (checkpoints, journaled answers), so one sentence says so
# rather than click's bare "Aborted!".
INTERRUPTED = (
    "interrupted; what finished is kept (checkpointed rows, journaled answers, submitted "
    "batches): run the same command again to go on from there"
)


# The shell's convention for a process ended by SIGINT (128 + 2).
STOPPED_BY_CTRL_C = 130


def _set_log_level(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        logging.getLogger().setLevel(getattr(logging, value.upper()))


def _log_level_option(default: str | None) -> click.Option:
    return click.Option(
        ["--log-level"],
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default=default,
        show_default=default is not None,
        expose_value=False,
        is_eager=True,  # set before the other options' callbacks log anything
        callback=_set_log_level,
        help="How much to log; DEBUG also shows tracebacks.",
    )


class LazyGroup(click.Group):
    """A group whose ``COMMANDS`` are imported when asked for; each takes ``--log-level``
    after its name too (``mmirage run CONFIG --log-level INFO``)."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo(f"error: {INTERRUPTED}", err=True)
            ctx.exit(STOPPED_BY_CTRL_C)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name].split(":")
            command = getattr(importlib.import_module(module), attribute)
            _add_log_level(command)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)


def _show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    from mmirage.cli.version import show_version  # deferred: it may run git, only when asked

    show_version(ctx, param, value)


def _add_log_level(command: click.Command) -> None:
    """``--log-level`` on ``command`` and, for a group, on each of its subcommands."""
    if not any(p.name == "log_level" for p in command.params):
        command.params.append(_log_level_option(None))
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _add_log_level(sub)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_show_version,
    help="Show the version and where this mmirage was installed from, and exit.",
)
def main() -> None:
    """Push datasets through LLMs: live, through provider batch APIs, or locally."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")


main.params.append(_log_level_option("WARNING"))


def entry() -> NoReturn:
    """The ``mmirage`` program: ``main``, then an exit without the interpreter's teardown
    (``process_exit``)."""
    try:
        main()
    except SystemExit as exc:
        exit_without_teardown(exc.code)
    exit_without_teardown(0)
