"""Every mmirage exception derives from ``MmirageError``; its branch says whose move it is.

``UserError``: the user must fix something before the work can run (a config, a path, a key);
the CLI exits 2. ``WorkFailed``: the work was attempted and failed (a shard, a merge, a batch);
the CLI exits 1. Other ``MmirageError``s are internal signals caught inside the library.
``str(err)`` is always one sentence saying what happened and what to do.

This module imports nothing of mmirage, so that every layer can import it.
"""

from __future__ import annotations


class MmirageError(Exception):
    """Base of every exception defined in mmirage."""


class UserError(MmirageError):
    """Something the user must fix (configuration, data path, directory, API key): exit 2."""


class WorkFailed(MmirageError):
    """The work was attempted and failed; rerunning (or ``mmirage retry``) may finish it: exit 1."""


__all__ = ["MmirageError", "UserError", "WorkFailed"]
