"""Directories a run must write to, checked before it starts: a path problem (a file in the
way, no permission, a read-only disk) is the user's to fix, named in one sentence."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from mmirage.errors import UserError


class UnusableDirError(UserError):
    """A directory a run must write to cannot be used (a file in the way, no permission, a
    read-only disk); ``str(err)`` names the config field, the path and what to do."""


_PATH_FIXES = {
    errno.ENOTDIR: "is a file, not a directory; move the file away or choose another path",
    errno.EEXIST: "is a file, not a directory; move the file away or choose another path",
    errno.EACCES: "is not writable; give write permission or choose another directory",
    errno.EPERM: "is not writable; give write permission or choose another directory",
    errno.EROFS: "is on a read-only filesystem; choose a directory on a writable disk",
}


def ensure_writable_dir(path: Path, field: str) -> None:
    """Prove that ``path`` can be created and written, or raise ``UnusableDirError`` naming
    ``field``. Run before a shard starts: a path problem is the user's to fix, and must not
    surface as a failed shard with a raw errno message. Nothing is created: a run refused
    later (a missing key, say) leaves no empty folders behind."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".mmirage-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise unusable_dir(exc, path, field) from None


def is_path_problem(exc: OSError) -> bool:
    """Whether ``exc`` is a path the user must fix (a file in the way, no permission, a
    read-only disk), as opposed to a failure of the work (disk full, I/O error)."""
    return exc.errno in _PATH_FIXES


def unusable_dir(exc: OSError, path: Path, field: str) -> UnusableDirError:
    """``exc`` (raised while writing under ``path``) as one sentence: field, path, what to do."""
    where = _blocking_path(path)
    fix = _PATH_FIXES.get(exc.errno or 0)
    if fix is None:
        fix = f"cannot be written ({exc.strerror or exc}); check the path and the disk"
    return UnusableDirError(f"{field}: {where} {fix}")


def _blocking_path(path: Path) -> Path:
    """The part of ``path`` to name: its first component that is not a directory (a file in
    the way, or the first one that could not be created), else ``path`` itself."""
    for candidate in [*reversed(path.parents), path]:
        if not candidate.is_dir():
            return candidate
    return path
