"""A request's key in the answer store: a digest of exactly what was asked.

The digest covers the output's identity (``Processor.request_identity``: the processor's and
the output's settings that shape a request — provider, base URL, model, sampling, schema),
the row's key (two rows with the same prompt stay two requests) and what was rendered for the
row: its prompt and image paths, or, for an output without a prompt (``custom``), its
variables and source row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from mmirage.core.process.base import Processor
from mmirage.core.render.variables import image_urls

if TYPE_CHECKING:
    from mmirage.config.processing_params import OutputVar

_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY


def _dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=str, option=_OPTS)


def request_identity(settings: Any) -> bytes:
    """``settings`` (JSON-able) as the prefix every digest of that output starts from."""
    return _dumps(settings) + b"\0"


def request_digest(identity: bytes, row_key: str, material: str) -> bytes:
    """The store's key: ``identity`` (settings), the row and what was rendered for it."""
    text = f"{row_key}\0{material}".encode("utf-8", "surrogatepass")
    return hashlib.blake2b(identity + text, digest_size=16).digest()


class RequestKeys:
    """One dataset's request keys: each output's identity is worked out once."""

    def __init__(self, image_names: list[str]) -> None:
        self.image_names = image_names
        self._identities: dict[str, bytes | None] = {}

    def identity(self, output: OutputVar, proc: Processor) -> bytes | None:
        """The prefix of ``output``'s digests; ``None``: its answers are not stored."""
        name = output.name
        if name not in self._identities:
            settings = proc.request_identity(output)
            self._identities[name] = None if settings is None else request_identity(settings)
        return self._identities[name]

    def digests(
        self,
        identity: bytes,
        going: Sequence[int],
        prompts: Sequence[str | None],
        keys: Sequence[str],
        variables: Sequence[dict[str, Any]],
        rows: Sequence[dict[str, Any]] | None,
    ) -> list[bytes]:
        """The key of each request: one per row ``going`` (a position in the group's columns
        ``keys``, ``variables`` and ``rows``) with its prompt. ``rows`` only for an output
        without a prompt, whose answer depends on the row's variables and source row."""
        if rows is not None:
            return [
                request_digest(identity, keys[p], _dumps([variables[p], rows[p]]).decode())
                for p in going
            ]
        if self.image_names:
            names = self.image_names
            return [
                request_digest(
                    identity,
                    keys[p],
                    f"{prompt}\0{_dumps(image_urls(variables[p], names)).decode()}",
                )
                for p, prompt in zip(going, prompts, strict=True)
            ]
        # The common case, by millions: the identity hashed once, its state copied per row.
        copy = hashlib.blake2b(identity, digest_size=16).copy
        digests = []
        for p, prompt in zip(going, prompts, strict=True):
            state = copy()
            state.update(f"{keys[p]}\0{prompt or ''}".encode("utf-8", "surrogatepass"))
            digests.append(state.digest())
        return digests


__all__ = ["RequestKeys", "request_digest", "request_identity"]
