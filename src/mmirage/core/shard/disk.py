"""A full disk, said in one sentence: which file could not be written and what to do.

``No space left on device`` alone names nothing (a buffered write or an fsync has no file
name), so every place that writes a shard's files (part file, checkpoint, journal, publish,
status.json) writes inside ``writing(path, setting)``, which turns that error into
``DiskFullError`` naming the file and the setting that chose its disk. Nothing is lost: the
checkpoint only ever records what was made durable, so the shard resumes once there is room.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mmirage.errors import WorkFailed


class DiskFullError(WorkFailed):
    """A shard file could not be written for lack of space; ``str(err)`` names it."""


def disk_full_message(path: Path | str, setting: str) -> str:
    return (
        f"no space left on the device of {path}; free space on that disk, or choose another "
        f"{setting}, then run again (the shard resumes from its last checkpoint)"
    )


def write_error(exc: OSError, path: Path | str, setting: str) -> Exception:
    """What a failed write of ``path`` raises: ``DiskFullError`` naming it (caused by
    ``exc``) for a full disk, else ``exc`` itself. For a hot path, where ``writing``'s context
    manager costs too much."""
    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
        return exc
    full = DiskFullError(disk_full_message(path, setting))
    full.__cause__ = exc
    return full


@contextmanager
def writing(path: Path | str, setting: str) -> Iterator[None]:
    """Run a write of ``path``; a full disk becomes ``DiskFullError`` naming it."""
    try:
        yield
    except OSError as exc:
        raise write_error(exc, path, setting)  # noqa: B904 - its cause is set
