"""Image references: http(s) URLs pass through, local paths become data URLs."""

from __future__ import annotations

import base64
import mimetypes
from functools import lru_cache
from pathlib import Path

from llm_kit.errors import ItemError

# Sniffed from the first bytes, so a misnamed file still gets its real type.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"BM", "image/bmp"),
)


def is_remote(url: str) -> bool:
    return url.startswith(("http://", "https://"))


def is_data_url(url: str) -> bool:
    return url.startswith("data:")


def sniff_media_type(data: bytes, name: str = "") -> str:
    for magic, media_type in _MAGIC:
        if data.startswith(magic):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    guessed, _ = mimetypes.guess_type(name)
    return guessed or "application/octet-stream"


@lru_cache(maxsize=256)
def _load_file_as_data_url(path: str) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ItemError(
            f"cannot read image {path!r} ({exc.strerror or exc}); check that the file exists "
            "and is readable, or pass an http(s) or data: URL"
        ) from None
    media_type = sniff_media_type(data, path)
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def resolve_image_url(url: str) -> str:
    """Return an http(s) URL or a data URL for ``url`` (a URL, a data URL or a local path)."""
    if is_remote(url) or is_data_url(url):
        return url
    path = url[7:] if url.startswith("file://") else url
    return _load_file_as_data_url(str(Path(path).expanduser()))


def split_data_url(url: str) -> tuple[str, str]:
    """``data:<mime>;base64,<b64>`` → (mime, b64). Raises ItemError on any other shape."""
    header, sep, payload = url.partition(",")
    if not sep or not header.startswith("data:") or not header.endswith(";base64"):
        raise ItemError(
            f"image data URL must look like 'data:<mime>;base64,<data>', got {url[:40]!r}..."
        )
    return header[5:-7], payload
