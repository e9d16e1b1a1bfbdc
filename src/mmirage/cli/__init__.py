"""The ``mmirage`` command line. Exit codes: 0 ok, 1 the work failed, 2 usage or config error."""

from __future__ import annotations

import logging

import click

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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


def _register_subcommands() -> None:
    # One module per command group; each imports its heavy modules inside its commands.
    from mmirage.cli.emulate import emulate
    from mmirage.cli.job import job
    from mmirage.cli.merge import COMMANDS as MERGE_COMMANDS
    from mmirage.cli.retry_check import COMMANDS as RETRY_CHECK_COMMANDS
    from mmirage.cli.run import COMMANDS as RUN_COMMANDS
    from mmirage.cli.slurm import COMMANDS as SLURM_COMMANDS

    commands = (*RUN_COMMANDS, *RETRY_CHECK_COMMANDS, *MERGE_COMMANDS, *SLURM_COMMANDS)
    for command in (emulate, job, *commands):
        main.add_command(command)


_register_subcommands()
