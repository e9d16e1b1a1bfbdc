"""What a shard's answer store keeps of its ``batch_api`` submissions (``SubmittedRequests``).

A batch_api request is answered later, by its provider batch: what the store keeps for it is
the version of the request (``batch.versions``) the provider holds under its custom_id, under
a key of its own (the custom_id's digest, apart from every answer's). Like answers, these are
appended to the log as they come and read from the index by later runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from mmirage.core.shard.answers import AnswerStore

_OUTPUT = "__submitted__"  # the entries' output field: no output of a config is named so


def _key(custom_id: str) -> bytes:
    return hashlib.blake2b(f"submitted\0{custom_id}".encode(), digest_size=16).digest()


class ShardSubmissions:
    """``SubmittedRequests`` over one shard's answer store."""

    def __init__(self, store: AnswerStore) -> None:
        self.store = store

    def recall(self, ids: Sequence[str]) -> dict[str, str]:
        by_key = {_key(custom_id): custom_id for custom_id in ids}
        return {by_key[d]: str(result.value) for d, result in self.store.stored(list(by_key))}

    def remember(self, submitted: Iterable[tuple[str, str]]) -> None:
        add = self.store.add_answer
        for custom_id, version in submitted:
            add(_key(custom_id), custom_id, _OUTPUT, version, 0, 0)
        self.store.flush()  # before the chunk is marked remembered

    def count(self, *, reused: int, sent: int) -> None:
        self.store.reused += reused
        self.store.asked += sent


__all__ = ["ShardSubmissions"]
