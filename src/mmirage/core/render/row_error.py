"""``RowError``: one row cannot be processed (its own module: the image checks raise it too)."""

from __future__ import annotations

from mmirage.errors import MmirageError


class RowError(MmirageError, ValueError):
    """One row cannot be processed; ``str(err)`` is one sentence saying why and what to do.

    ``variable``/``key``/``path`` name what failed where that is known, so a report can group
    errors without parsing the message.
    """

    def __init__(
        self,
        message: str,
        *,
        variable: str | None = None,
        key: str | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message)
        self.variable = variable
        self.key = key
        self.path = path
