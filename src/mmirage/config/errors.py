"""The one error type a user sees for a bad configuration."""

from __future__ import annotations

from mmirage.errors import MmirageError, UserError


class ConfigError(UserError, ValueError):
    """A configuration that cannot run, with where the problem is and what is allowed.

    ``str(err)`` is one sentence: ``<file>: <field path>: <problem>``.
    """

    def __init__(self, source: str, path: str, problem: str) -> None:
        self.source = source
        self.path = path
        self.problem = problem.rstrip(".")
        where = f"{source}: {path}" if path else source
        super().__init__(f"{where}: {self.problem}.")


class FieldError(MmirageError, ValueError):
    """Raised inside a config class's validation to blame one field (or a sub-path of it).

    The loader turns it into a ``ConfigError`` whose path ends with ``field``.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        super().__init__(problem)
