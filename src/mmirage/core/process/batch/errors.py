"""The errors of bringing batch results home (``check``, ``merge``, ``retry``)."""

from __future__ import annotations

from mmirage.errors import UserError, WorkFailed


class CollectorError(WorkFailed):
    """Check, merge or retry cannot go on; ``str(err)`` is one sentence saying what to do."""


class CollectorSetupError(CollectorError, UserError):
    """Check, merge or retry cannot start until the user fixes the setup (a missing key, a
    provider with no adapter)."""


class IncompleteResultsError(WorkFailed):
    """A downloaded result file holds fewer results than the provider says the batch has
    (an empty, torn or undecodable download): it must be downloaded again, never stored."""

    def __init__(self, message: str, *, got: int, expected: int) -> None:
        super().__init__(message)
        self.got = got
        self.expected = expected


class PriceFileError(UserError, ValueError):
    """A price file (``MMIRAGE_PRICES``, or the shipped table) cannot be used; ``str(err)``
    says why."""


__all__ = ["CollectorError", "CollectorSetupError", "IncompleteResultsError", "PriceFileError"]
