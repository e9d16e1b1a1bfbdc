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

import os

from llm_kit.errors import ItemError
from llm_kit.images import check_image_file
from mmirage.core.render.row_error import RowError

OPT_IN_FIELD = "processing_params.allow_absolute_image_paths"


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
    if not os.path.isfile(real):
        where = f" ({raw!r} resolved against image_base_path {base!r})" if base else ""
        raise RowError(
            f"image variable '{variable}': file {shown!r} does not exist{where}; "
            "check the path or the dataset's image_base_path",
            variable=variable,
            path=shown,
        )
    try:
        check_image_file(real, name=shown)
    except ItemError as exc:
        message = f"image variable '{variable}': {exc}"
        raise RowError(message, variable=variable, path=shown) from None
    return real


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
