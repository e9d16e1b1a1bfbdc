"""Datasets and outputs on object storage: fsspec URLs (``s3://``, ``gs://``, ``hf://``) as a
dataset's ``path`` or ``output_dir``.

This module only tells URLs from local paths, says where a URL's local files live and which
environment variables its client reads; it imports no fsspec, so a local pipeline never loads
it. ``store.ObjectStore`` talks to the storage itself.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

# A scheme, then "://": what fsspec takes as a URL. A Windows drive ("C:\\") never matches.
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

MIRROR_FOLDER = "object-storage"
"""Under ``state_dir``: each object-storage output_dir's part files and checkpoints."""


# The environment variables each protocol's client reads (a name ending in "_" is a prefix): a
# Ray task on another node gets them from the driver's environment, not its own.
CLIENT_VARIABLES: dict[str, tuple[str, ...]] = {
    "s3": ("AWS_",),
    "s3a": ("AWS_",),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "STORAGE_EMULATOR_HOST"),
    "gcs": ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "STORAGE_EMULATOR_HOST"),
    "hf": ("HF_TOKEN", "HF_ENDPOINT", "HUGGING_FACE_HUB_TOKEN"),
}


# Variables that name a file on the driver's machine: a node reads its own, since the driver's
# path may not exist there.
_FILE_PATHS = frozenset(
    {
        "AWS_CA_BUNDLE",
        "AWS_CONFIG_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "GOOGLE_APPLICATION_CREDENTIALS",
    }
)


def is_client_variable(url: str, name: str) -> bool:
    """Whether ``url``'s filesystem client reads the environment variable ``name`` (one that
    names a file on this machine is left out: a node reads its own)."""
    return name not in _FILE_PATHS and any(
        name == known or (known.endswith("_") and name.startswith(known))
        for known in CLIENT_VARIABLES.get(protocol(url), ())
    )


def is_url(path: object) -> bool:
    """Whether ``path`` is an object-storage URL rather than a local path."""
    return isinstance(path, str) and _URL.match(path) is not None


def protocol(url: str) -> str:
    return url.split("://", 1)[0].lower()


def join(url: str, name: str) -> str:
    return f"{url.rstrip('/')}/{name}"


def mirror_dir(state_dir: str | None, url: str) -> Path:
    """The local folder that stands for ``url`` (an output_dir): rows are appended, checkpointed
    and converted there, and each finished shard is uploaded from there. Under ``state_dir``,
    which every node of a run sees; named after the URL, so the same URL is the same folder."""
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    slug = _UNSAFE.sub("_", url.split("://", 1)[-1]).strip("_")[-60:]
    return Path(os.path.expanduser(state_dir or ".")) / MIRROR_FOLDER / f"{slug}-{digest}"


__all__ = [
    "CLIENT_VARIABLES",
    "MIRROR_FOLDER",
    "is_client_variable",
    "is_url",
    "join",
    "mirror_dir",
    "protocol",
]
