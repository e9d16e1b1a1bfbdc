"""`python -m mmirage.cli` is the `mmirage` command."""

from mmirage.cli import entry

entry()
