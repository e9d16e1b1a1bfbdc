"""A row's local image file: confined to the dataset's ``image_base_path`` and checked to be an
image before anything reads it whole.

A row's image path is data, not configuration: ``../../etc/passwd``, ``/proc/self/environ`` or
``file:///etc/hostname`` must not be read, sent to a provider or written by
``--export-prompts``. So a relative path must stay inside ``image_base_path`` (the working
directory without one) once ``..`` and symlinks are resolved; an absolute path or ``file://``
URL must lie inside it too, unless ``processing_params.allow_absolute_image_paths`` is true;
and the file must be a regular file, at most ``llm_kit.images.MAX_IMAGE_BYTES``, that starts
like an image. Errors name the variable and the path, never the file's bytes.
"""

from __future__ import annotations

import errno
import os
import stat

from llm_kit.errors import ItemError
from llm_kit.images import check_image_file
from mmirage.core.render.row_error import RowError

OPT_IN_FIELD = "processing_params.allow_absolute_image_paths"
_SHOWN_CHARS = 160  # of a path quoted in an error: a path too long is cut in the middle


def local_image_path(
    reference: str,
    variable: str,
    image_base_path: str | None = None,
    *,
    allow_absolute: bool = False,
) -> str:
    """The real (symlink-free, absolute) path of the row's local image ``reference``, a path
    or a ``file://`` URL; RowError naming ``variable`` and the path when it may not be used."""
    raw = reference[7:] if reference.startswith("file://") else reference
    if "\x00" in raw:  # the OS takes no such name (Python raises ValueError, not OSError)
        raise RowError(
            f"image variable '{variable}': the path {_quoted(raw)} holds a NUL byte, which no "
            "file name can; fix the row's path",
            variable=variable,
            path=raw,
        )
    path = os.path.expanduser(raw)
    base = os.path.expanduser(image_base_path) if image_base_path else None
    root = os.path.realpath(base or os.getcwd())
    absolute = os.path.isabs(path)
    # What the user wrote, made absolute: the path that messages name.
    shown = os.path.abspath(path if absolute else os.path.join(base or os.getcwd(), path))
    real = os.path.realpath(shown)
    if not _inside(real, root) and not (absolute and allow_absolute):
        raise RowError(
            _outside_message(variable, reference, base, absolute), variable=variable, path=raw
        )
    _check_file(real, shown, raw, variable, base)
    try:
        check_image_file(real, name=shown)
    except ItemError as exc:
        message = f"image variable '{variable}': {exc}"
        raise RowError(message, variable=variable, path=shown) from None
    return real


def _check_file(real: str, shown: str, raw: str, variable: str, base: str | None) -> None:
    """RowError when ``real`` is not a file: missing, a directory, or a path the OS refuses
    (a name or path too long, a folder it may not enter), each said as such."""
    try:
        info = os.stat(real)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise RowError(
                f"image variable '{variable}': cannot use {_quoted(shown)} "
                f"({exc.strerror or type(exc).__name__}); fix the row's path",
                variable=variable,
                path=shown,
            ) from None
        where = f" ({_quoted(raw)} resolved against image_base_path {base!r})" if base else ""
        raise RowError(
            f"image variable '{variable}': file {_quoted(shown)} does not exist{where}; "
            "check the path or the dataset's image_base_path",
            variable=variable,
            path=shown,
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise RowError(
            f"image variable '{variable}': {_quoted(shown)} is a directory, not an image file; "
            "point the row at an image",
            variable=variable,
            path=shown,
        )


def _quoted(path: str) -> str:
    """``path`` as an error names it: quoted (a NUL byte shows as ``\\x00``), and cut in the
    middle when too long to read."""
    if len(path) > _SHOWN_CHARS:
        path = f"{path[: _SHOWN_CHARS // 2]}...{path[-_SHOWN_CHARS // 2 :]}"
    return repr(path)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _outside_message(variable: str, reference: str, base: str | None, absolute: bool) -> str:
    folder = f"image_base_path {base!r}" if base else "the working directory (no image_base_path)"
    if absolute:
        return (
            f"image variable '{variable}': {reference!r} is an absolute path outside {folder}, "
            f"which is refused; move the image inside it, or set {OPT_IN_FIELD}: true to "
            "allow absolute image paths"
        )
    return (
        f"image variable '{variable}': {reference!r} leads outside {folder} ('..' or a symlink), "
        "which is refused; keep the rows' image paths inside it"
    )
