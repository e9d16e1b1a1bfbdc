"""`python -m mmirage` is the `mmirage` command."""

from mmirage.cli import entry

entry()
