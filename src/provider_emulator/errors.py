"""The emulator's own exception: a request the provider would refuse."""

from __future__ import annotations


class RequestError(Exception):
    """A request the provider would refuse (a 4xx, or a server's 500); each family renders it
    its own way."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind  # the error's type where the family has one (None: its usual one)
