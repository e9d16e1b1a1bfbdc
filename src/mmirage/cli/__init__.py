"""The ``mmirage`` command line. Exit codes: 0 ok, 1 the work failed, 2 usage or config error."""

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
}


# Ctrl-C: what a run finished stays (checkpoints, journaled answers), so one sentence says so
# rather than click's bare "Aborted!".
INTERRUPTED = (
    "interrupted; what finished is kept (checkpointed rows, journaled answers, submitted "
    "batches): run the same command again to go on from there"
)


class LazyGroup(click.Group):
    """A group whose ``COMMANDS`` are imported when asked for."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo(f"error: {INTERRUPTED}", err=True)
            ctx.exit(1)  # the work did not finish (errors.WORK_FAILED)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default="WARNING",
    show_default=True,
    help="How much to log; DEBUG also shows tracebacks.",
)
def main(log_level: str) -> None:
    """Push datasets through LLMs: live, through provider batch APIs, or locally."""
    logging.basicConfig(
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def entry() -> NoReturn:
    """The ``mmirage`` program: ``main``, then an exit without the interpreter's teardown
    (``process_exit``)."""
    try:
        main()
    except SystemExit as exc:
        exit_without_teardown(exc.code)
    exit_without_teardown(0)
