"""Every mmirage exception derives from ``MmirageError``; its branch says whose move it is.

``UserError``: the user must fix something before the work can run (a config, a path, a key);
the CLI exits 2. ``WorkFailed``: the work was attempted and failed (a shard, a merge, a batch);
the CLI exits 1. Other ``MmirageError``s are internal signals caught inside the library.
``str(err)`` is always one sentence saying what happened and what to do.

This module imports nothing of mmirage, so that every layer can import it (and llm_kit only
inside ``require_extra``).
"""

from __future__ import annotations

from types import ModuleType


class MmirageError(Exception):
    """Base of every exception defined in mmirage."""


class UserError(MmirageError):
    """Something the user must fix (configuration, data path, directory, API key): exit 2."""


class WorkFailed(MmirageError):
    """The work was attempted and failed; rerunning (or ``mmirage retry``) may finish it: exit 1."""


class MissingExtra(UserError):
    """A feature needs an optional dependency that this install left out: exit 2."""


class RowNotFound(MmirageError, LookupError):
    """``mmirage view``: no row where a page asked for one (the page answers 404)."""


class BadQuery(MmirageError, ValueError):
    """``mmirage view``: a query parameter that is not what the route takes (400)."""


def require_extra(module: str, extra: str, feature: str) -> ModuleType:
    """``module`` imported, or ``MissingExtra`` (exit 2) saying which extra of this project
    brings it: llm_kit's sentence, raised as mmirage's own error."""
    # Imported here: llm_kit's package loads pydantic and more, which `mmirage --help` skips.
    from llm_kit.errors import MissingExtraError
    from llm_kit.errors import require_extra as import_extra

    try:
        return import_extra(module, extra, feature)
    except MissingExtraError as exc:
        raise MissingExtra(str(exc)) from None


__all__ = [
    "BadQuery",
    "MissingExtra",
    "MmirageError",
    "RowNotFound",
    "UserError",
    "WorkFailed",
    "require_extra",
]
