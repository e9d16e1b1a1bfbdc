"""The errors of bringing batch results home (``check``, ``merge``, ``retry``)."""

from __future__ import annotations


class CollectorError(Exception):
    """Check, merge or retry cannot go on; ``str(err)`` is one sentence saying what to do.
    ``exit_code`` 2 marks a problem of the setup (a missing key), 1 anything else."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class IncompleteResultsError(Exception):
    """A downloaded result file holds fewer results than the provider says the batch has
    (an empty, torn or undecodable download): it must be downloaded again, never stored."""

    def __init__(self, message: str, *, got: int, expected: int) -> None:
        super().__init__(message)
        self.got = got
        self.expected = expected


__all__ = ["CollectorError", "IncompleteResultsError"]
