"""``ObjectStore``: one dataset's object storage, through fsspec, with its credentials.

Credentials come from the environment: the filesystem's own variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``... as boto reads them), or the dataset's ``storage_options``, whose values
NAME environment variables. The values read are secrets: they go to fsspec and nowhere else,
and every error text from the storage is redacted with them before it is raised.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from llm_kit.redact import redact_text
from mmirage.errors import UserError, WorkFailed, require_extra
from mmirage.storage import protocol

# The package each protocol needs, and the extra of this project that brings it.
_EXTRAS: dict[str, tuple[str, str]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "hf": ("huggingface_hub", "hf"),
}


# Storage clients whose DEBUG lines quote request headers (an S3 Authorization header names the
# access key id): they log at WARNING at most, whatever --log-level says.
_CHATTY_LOGGERS = ("botocore", "aiobotocore", "boto3", "s3transfer", "s3fs", "gcsfs", "urllib3")


class StorageError(WorkFailed):
    """Object storage refused or failed a call (network, permissions): rerun once it is
    reachable. ``str(err)`` names the URL, with no secret in it."""


class ObjectStore:
    """The filesystem behind ``url`` (a dataset's ``path`` or ``output_dir``), made on first
    use. ``where`` names the config field, for error sentences."""

    def __init__(self, url: str, storage_options: Mapping[str, str] | None, where: str) -> None:
        self.url, self.where = url, where
        self._option_names = dict(storage_options or {})
        self._fs: Any = None
        self._secrets: list[str] = []

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = self._filesystem()
        return self._fs

    def _filesystem(self) -> Any:
        scheme = protocol(self.url)
        module, extra = _EXTRAS.get(scheme, ("fsspec", "s3"))
        feature = f"{self.where} = {self.url!r}"
        require_extra(module, extra, feature)
        fsspec = require_extra("fsspec", extra, feature)
        for name in _CHATTY_LOGGERS:
            logger = logging.getLogger(name)
            logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
        options = self._options()
        self._secrets = [v for v in options.values() if isinstance(v, str)]
        try:
            return fsspec.filesystem(scheme, **options)
        except (ImportError, ValueError) as exc:  # a protocol fsspec does not know
            raise UserError(
                f"{feature}: fsspec cannot open {scheme}:// URLs ({self._clean(exc)}); "
                "install the package it names or use s3://, gs:// or hf://"
            ) from None

    def _options(self) -> dict[str, str]:
        """The ``storage_options``, each environment variable's name replaced by its value."""
        values: dict[str, str] = {}
        for option, variable in self._option_names.items():
            value = os.environ.get(variable)
            if not value:
                raise UserError(
                    f"{self.where}: storage_options.{option} names the environment variable "
                    f"{variable}, which is not set; export it before the run"
                )
            values[option] = value
        return values

    def _clean(self, exc: BaseException) -> str:
        return redact_text(str(exc) or type(exc).__name__, self._secrets)

    @contextlib.contextmanager
    def calling(self, doing: str, url: str) -> Iterator[None]:
        """Turn a storage failure into a ``StorageError`` naming ``url``, secrets blanked."""
        try:
            yield
        except (UserError, StorageError):
            raise
        except Exception as exc:  # fsspec backends raise their clients' own errors too
            raise StorageError(
                f"{self.where}: {doing} {url} failed ({self._clean(exc)}); check the URL, "
                "the credentials and that the storage is reachable, then rerun"
            ) from None

    def exists(self, url: str) -> bool:
        with self.calling("looking for", url):
            self.fs.invalidate_cache(url)  # another process may have written it since
            return bool(self.fs.exists(url))

    def isdir(self, url: str) -> bool:
        with self.calling("looking at", url):
            return bool(self.fs.isdir(url))

    def size(self, url: str) -> int:
        with self.calling("looking at", url):
            self.fs.invalidate_cache(url)
            return int(self.fs.size(url))

    def glob(self, pattern: str) -> list[str]:
        """Matching URLs, sorted, with their protocol."""
        with self.calling("listing", pattern):
            return sorted(self.fs.unstrip_protocol(p) for p in self.fs.glob(pattern))

    def open(self, url: str) -> IO[bytes]:
        with self.calling("opening", url):
            return self.fs.open(url, "rb")

    def upload(self, local: Path, url: str) -> None:
        """``local`` (a file, or a folder's files) to ``url``. A file is one object: S3, GCS
        and the Hub show it under its name only once the upload is complete."""
        with self.calling("uploading to", url):
            self.fs.put(str(local), url, recursive=local.is_dir())

    def download(self, url: str, local: Path) -> None:
        """``url`` into ``local``, through a temporary sibling: never a torn copy."""
        tmp = local.with_name(f".{local.name}.tmp.{os.getpid()}")
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.calling("downloading", url):
                self.fs.get_file(url, str(tmp))
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)

    def remove(self, url: str) -> None:
        if self.exists(url):
            with self.calling("removing", url):
                self.fs.rm(url, recursive=True)


__all__ = ["ObjectStore", "StorageError"]
