"""A dataset's shard outputs when its ``output_dir`` is on object storage, and the factory
every command builds a (dataset, shard)'s ``ShardOutput`` with.

The part file, its checkpoint and the conversion stay local, in the URL's mirror folder under
``state_dir`` (``mmirage.storage.mirror_dir``): appending and truncating need a filesystem.
Each finished shard is converted there as a local publish does, then uploaded as one object
(``<output_dir>/shard-<k>-of-<n>.<format>``), which object storage shows under that name only
once it is complete; the local copy then goes. The object is the published shard: ``run``,
``check``, ``stats`` and ``merge`` look for it there, and read it back from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mmirage.core.shard.integrity import damage as integrity_damage
from mmirage.core.shard.integrity import sha256_of
from mmirage.core.shard.output import ShardCheckpoint, ShardOutput
from mmirage.core.shard.recovery import Locate
from mmirage.core.writer.formats import Format, format_of
from mmirage.storage import is_url, join, mirror_dir
from mmirage.storage.store import ObjectStore

if TYPE_CHECKING:
    from mmirage.config.loading_params import DatasetConfig, LoadingParams

# One object per shard: a folder (hf) cannot appear at once (the config refuses it).
REMOTE_FORMATS: tuple[Format, ...] = ("jsonl", "parquet")


class RemoteShardOutput(ShardOutput):
    """``ShardOutput`` working in a local mirror folder, publishing to object storage."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, str] | None,
        mirror: Path,
        shard_id: int,
        num_shards: int,
        output_format: Format,
    ) -> None:
        super().__init__(str(mirror), shard_id, num_shards, output_format)
        self.url = url.rstrip("/")
        self.store = ObjectStore(self.url, storage_options, "loading_params.datasets[].output_dir")

    def object_url(self, fmt: Format) -> str:
        return join(self.url, self.path_for(fmt).name)

    def _formats(self) -> tuple[Format, ...]:
        return (self.format, *(f for f in REMOTE_FORMATS if f != self.format))

    def find_published(self) -> Path | None:
        """Where the published object's local copy goes (it may not be there yet), or
        ``None`` when no object is published."""
        for fmt in self._formats():
            if self.store.exists(self.object_url(fmt)):
                return self.path_for(fmt)
        return None

    def local_copy(self) -> Path | None:
        """The published object, downloaded unless the local copy is already what the
        checkpoint says was published."""
        found = self.find_published()
        if found is None:
            return None
        url = self.object_url(format_of(found))
        ckpt = ShardCheckpoint.load(self.checkpoint_path)
        expected = ckpt.published_as() if ckpt is not None else None
        kept = (
            found.is_file()
            and expected is not None
            and found.stat().st_size == expected.size == self.store.size(url)
            and sha256_of(found) == expected.sha256
        )
        if not kept:
            self.store.download(url, found)
        return found

    def finished(self) -> ShardCheckpoint | None:
        if self.recomputing:
            return None
        if self.find_published() is None and not self._finish_upload():
            return None
        if ShardCheckpoint.load(self.checkpoint_path) is None:
            self.local_copy()  # its rows are counted from the object
        return super().finished()

    def _finish_upload(self) -> bool:
        """A run that stopped between the local publish and its upload left the shard here,
        complete: upload it now (if it is still what was published) rather than compute it
        again. Whether it was."""
        local = self.path_for(self.format)
        ckpt = ShardCheckpoint.load(self.checkpoint_path)
        expected = ckpt.published_as() if ckpt is not None and ckpt.complete else None
        if expected is None or not local.is_file():
            return False
        if integrity_damage(local, expected, full=True) is not None:
            return False
        self._upload(local)
        return True

    def damage(self, *, full: bool = False) -> str | None:
        """As ``ShardOutput.damage``, of the object: its size, or with ``full`` its rows and
        checksum (a download)."""
        found = self.find_published()
        ckpt = ShardCheckpoint.load(self.checkpoint_path)
        expected = ckpt.published_as() if ckpt is not None else None
        if found is None or expected is None:
            return None
        url = self.object_url(format_of(found))
        if full:
            local = self.local_copy()
            assert local is not None
            problem = integrity_damage(local, expected, full=True)
        else:
            size = self.store.size(url)
            problem = (
                None
                if size == expected.size
                else (f"holds {size} bytes, {expected.size} were published")
            )
        return None if problem is None else f"published shard {url} {problem}"

    def salvage(self, fp: str, locate: Locate) -> ShardCheckpoint:
        self.local_copy()
        ckpt = super().salvage(fp, locate)
        for fmt in REMOTE_FORMATS:
            self.store.remove(self.object_url(fmt))
        return ckpt

    def _install(self, ckpt: ShardCheckpoint) -> None:
        super()._install(ckpt)
        self._upload(self.path_for(self.format))

    def _upload(self, local: Path) -> None:
        self.store.upload(local, self.object_url(self.format))
        for fmt in REMOTE_FORMATS:  # an older version in another format is not this shard
            if fmt != self.format:
                self.store.remove(self.object_url(fmt))
        local.unlink(missing_ok=True)  # published: the object is the shard now


def upload_merged(dataset: DatasetConfig, merged: Path) -> str:
    """A merge written in the mirror, uploaded to ``<output_dir>/merged[.<format>]``; its URL.
    (An hf merge is a folder: its files are uploaded one by one.)"""
    url = join(dataset.output_dir, merged.name)
    store = ObjectStore(url, dataset.storage_options, "loading_params.datasets[].output_dir")
    store.remove(url)  # an earlier merge's files must not mix with this one's
    store.upload(merged, url)
    return url


def output_folder(lp: LoadingParams, dataset: DatasetConfig) -> Path:
    """The local folder a dataset's part files live in: its output_dir, or for a URL the
    URL's mirror under ``state_dir``."""
    if is_url(dataset.output_dir):
        return mirror_dir(lp.state_dir, dataset.output_dir)
    return Path(dataset.output_dir).expanduser()


def shard_output(lp: LoadingParams, dataset: DatasetConfig, shard_id: int) -> ShardOutput:
    """The ``ShardOutput`` of one (dataset, shard): local as ever, or on object storage."""
    if not is_url(dataset.output_dir):
        return ShardOutput(dataset.output_dir, shard_id, lp.num_shards, lp.output_format)
    return RemoteShardOutput(
        dataset.output_dir,
        dataset.storage_options,
        output_folder(lp, dataset),
        shard_id,
        lp.num_shards,
        lp.output_format,
    )


__all__ = ["REMOTE_FORMATS", "RemoteShardOutput", "output_folder", "shard_output", "upload_merged"]
