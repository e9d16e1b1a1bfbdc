"""Image references: http(s) URLs pass through, local image files become data URLs.

A local path is read only when it is a regular file of at most ``MAX_IMAGE_BYTES`` whose first
bytes are an image format's signature: a path taken from data (``/proc/self/environ``, a
config file) must never be sent to a provider or quoted in an error. Errors name the path,
never the file's bytes.
"""

from __future__ import annotations

import base64
import logging
import mimetypes
import os
import re
import stat
from functools import lru_cache
from pathlib import Path

from llm_kit.errors import ItemError
from llm_kit.redact import clip, redact_text

logger = logging.getLogger(__name__)

# The largest image sent inline: the providers' own per-image limits are of this order.
MAX_IMAGE_BYTES = 20 * 1024 * 1024
IMAGE_FORMATS = "PNG, JPEG, GIF, WebP, BMP, TIFF, HEIC, AVIF or SVG"
# Python's own table only: a system's mime.types may name a type otherwise (image/x-ms-bmp).
_EXTENSIONS = mimetypes.MimeTypes(filenames=())
# An SVG is text: XML, after an optional byte-order mark and white space.
_SVG_STARTS = (b"<svg", b"<?xml")

# Sniffed from the first bytes, so a misnamed file still gets its real type.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)
# ISO media files: bytes 4-8 are "ftyp", then the brand.
_FTYP_BRANDS = {
    b"avif": "image/avif",
    b"avis": "image/avif",
    b"heic": "image/heic",
    b"heix": "image/heic",
    b"mif1": "image/heif",
}
_HEADER_BYTES = 16
_MIME = re.compile(r"[A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+")


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def is_data_url(url: str) -> bool:
    return url.startswith("data:")


def image_media_type(data: bytes) -> str | None:
    """The image type that ``data``'s first bytes announce; None when they are no image's."""
    for magic, media_type in _MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[4:8] == b"ftyp":
        return _FTYP_BRANDS.get(data[8:12])
    if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(_SVG_STARTS):
        return "image/svg+xml"
    return None


def extension_media_type(path: str) -> str | None:
    """The image type ``path``'s extension names (``None``: no image extension)."""
    named, _ = _EXTENSIONS.guess_type(path)
    return named if named is not None and named.startswith("image/") else None


def sniff_media_type(data: bytes, name: str = "") -> str:
    """The image type of ``data``, else a guess from ``name``'s extension."""
    guessed, _ = mimetypes.guess_type(name)
    return image_media_type(data) or guessed or "application/octet-stream"


def check_image_file(path: str, max_bytes: int = MAX_IMAGE_BYTES, name: str | None = None) -> str:
    """The media type of the image file at ``path`` (only its first bytes are read).

    ItemError, naming the path (or ``name``, how the caller's user wrote it), when it cannot be
    opened, is not a regular file, is larger than ``max_bytes`` or does not start like an image.
    """
    media_type, _ = _read_image(path, max_bytes, whole=False, name=name)
    return media_type


def read_image_file(path: str, max_bytes: int = MAX_IMAGE_BYTES) -> tuple[str, bytes]:
    """(media type, bytes) of the image file at ``path``; ItemError as ``check_image_file``."""
    return _read_image(path, max_bytes, whole=True)


def _read_image(
    path: str, max_bytes: int, *, whole: bool, name: str | None = None
) -> tuple[str, bytes]:
    shown = name or path
    try:
        # O_NONBLOCK: opening a FIFO must not hang; the check below refuses it.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ItemError(
            f"cannot read image {shown!r} ({exc.strerror or type(exc).__name__}); check that "
            "the file exists and is readable, or pass an http(s) or data: URL"
        ) from None
    except ValueError:  # a NUL byte, which no file name can hold
        raise ItemError(
            f"image path {shown!r} holds a NUL byte, which no file name can; fix the path"
        ) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ItemError(f"image {shown!r} is not a regular file; point it at an image file")
        if info.st_size > max_bytes:
            raise ItemError(
                f"image {shown!r} is {info.st_size} bytes, over the {max_bytes}-byte limit; "
                "shrink it or pass an http(s) URL"
            )
        # Read one byte past the limit: some files (under /proc) report a size of 0.
        data = f.read(max_bytes + 1 if whole else _HEADER_BYTES)
    media_type = image_media_type(data)
    if media_type is None:
        raise ItemError(
            f"{shown!r} is not an image file (its first bytes are not those of {IMAGE_FORMATS}); "
            "point it at an image"
        )
    if len(data) > max_bytes:
        raise ItemError(
            f"image {shown!r} is over the {max_bytes}-byte limit; shrink it or pass an http(s) URL"
        )
    return media_type, data


@lru_cache(maxsize=256)
def _load_file_as_data_url(path: str, typed_by_extension: bool = False) -> str:
    media_type, data = read_image_file(path)
    named = extension_media_type(path) if typed_by_extension else None
    if named is not None and named != media_type:  # said once per file: the cache
        logger.warning(
            "image %r holds %s data but its extension says %s: sent as %s, as the extension "
            "says; rename the file if that is wrong",
            path,
            media_type,
            named,
            named,
        )
    type_sent = named or media_type
    return f"data:{type_sent};base64,{base64.b64encode(data).decode('ascii')}"


def resolve_image_url(url: str, *, typed_by_extension: bool = False) -> str:
    """Return an http(s) URL or a data URL for ``url`` (a URL, a data URL or a local path).
    A local file's type is what its first bytes say, or, ``typed_by_extension``, what its
    extension says (the bytes must still be an image's; a mismatch is logged)."""
    if is_remote(url) or is_data_url(url):
        return url
    path = url[7:] if url.startswith("file://") else url
    return _load_file_as_data_url(str(Path(path).expanduser()), typed_by_extension)


def describe_image(url: str) -> str:
    """How an error names an image: its URL or path, never a data URL's bytes."""
    if is_data_url(url):
        media_type = url[5:].split(";", 1)[0].split(",", 1)[0]
        known = _MIME.fullmatch(media_type) and len(media_type) <= 60
        return f"an inline {media_type if known else 'data:'} image"
    return repr(clip(redact_text(url), 200))  # a URL may carry ?key=…


def split_data_url(url: str) -> tuple[str, str]:
    """``data:<mime>;base64,<b64>`` → (mime, b64). Raises ItemError on any other shape."""
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:") or not header.endswith(";base64"):
        raise ItemError(
            f"image data URL must look like 'data:<mime>;base64,<data>' ({describe_image(url)} "
            "does not)"
        )
    return header[5:-7], payload
