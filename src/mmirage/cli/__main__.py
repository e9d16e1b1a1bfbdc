"""`python -m mmirage.cli` is the `mmirage` command."""

from mmirage.cli import main

main()
