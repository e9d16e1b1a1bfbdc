"""Which requests the provider holds already: a batch_api request is never submitted twice.

A request's *version* is a digest of its line as uploaded and of where it goes (its
``receipts.endpoint``: provider and base URL). Once a chunk's batch is created, the version of
each of its requests is handed to the shard's answer store (``RunContext.submitted``) under its
custom_id, and the chunk is marked ``.remembered``. Before spooling, the processor asks which
versions are held: a request whose line is unchanged is answered by the batch that holds it
(the row keeps its placeholder); one whose line changed (its prompt, model or sampling was
edited) is submitted again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from mmirage.core.process.base import SubmittedRequests
from mmirage.core.process.batch.spool import SpooledChunk, read_lines


class SubmittedVersions:
    """One processor's view of what its shard submitted. ``memory`` None: nothing is kept
    (a processor built outside a shard run); ``dry_run``: asked, never told (a dry run
    exports exactly what a run would submit, and submits nothing)."""

    def __init__(self, memory: SubmittedRequests | None, endpoint: str, *, dry_run: bool) -> None:
        self.memory = memory
        self.dry_run = dry_run
        self._digest = hashlib.blake2b(f"{endpoint}\0".encode(), digest_size=16).copy
        self._recent: dict[str, str] = {}  # sent by a run killed before the store was told

    def version(self, line: bytes) -> str:
        state = self._digest()
        state.update(line)
        return state.hexdigest()

    def held(self, custom_ids: Sequence[str]) -> dict[str, str]:
        """The version the provider holds under each id that has one."""
        if self.memory is None or not custom_ids:
            return {}
        held = self.memory.recall(custom_ids)
        if self._recent:  # newer than the store's
            held.update((cid, self._recent[cid]) for cid in custom_ids if cid in self._recent)
        return held

    def of_chunk(self, chunk: SpooledChunk, lines: list[bytes]) -> list[tuple[str, str]]:
        """``(custom_id, version)`` of each request of ``chunk`` (its ``lines``)."""
        ids = (custom_id for custom_id, _, _ in chunk.read_ids())
        return [(cid, self.version(line)) for cid, line in zip(ids, lines, strict=True)]

    def sent(self, chunk: SpooledChunk, versions: list[tuple[str, str]]) -> None:
        """The provider now holds ``chunk``'s requests."""
        if self.dry_run or self.memory is None:
            return
        self.memory.remember(versions)
        chunk.remembered_path.touch()

    def recover(self, chunk: SpooledChunk) -> None:
        """A chunk sent by a run killed before the store was told: told now, and known to
        this run already (the store's index is read as it was when the run began)."""
        versions = self.of_chunk(chunk, read_lines(chunk))
        self._recent.update(versions)
        self.sent(chunk, versions)

    def count(self, *, reused: int, sent: int) -> None:
        if self.memory is not None and not self.dry_run:
            self.memory.count(reused=reused, sent=sent)


__all__ = ["SubmittedVersions"]
