"""One ``merge`` or ``retry`` at a time on a pipeline's results store.

Two of them on a fresh store would both number the same batches (``UNIQUE constraint
failed``) and both download every batch. So each holds an exclusive lock on
``results.sqlite.lock`` while its store is open; a second one waits for it, then finds the
batches stored and fetched, and writes the same rows. ``check`` never opens the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def exclusive(store: Path) -> Iterator[None]:
    """Hold the store's lock (waiting, and saying so, while another process holds it)."""
    path = store.with_name(f"{store.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.warning(
                "another 'mmirage merge' or 'mmirage retry' of this pipeline is using %s; "
                "waiting for it to finish",
                store,
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # the lock goes with the file, also when the process dies


__all__ = ["exclusive"]
