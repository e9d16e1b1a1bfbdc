"""One dataset's output for one shard: an append-only part file, its checkpoint, the publish.

Files, under the dataset's ``output_dir``:

* ``.parts/shard-<k>-of-<n>.jsonl`` — one JSON line per finished row, appended batch by batch;
* ``.parts/shard-<k>-of-<n>.ckpt.json`` — rows done, the part file's byte length at that point
  and where to read next; rewritten atomically after the part file is fsynced, so it never
  claims more than the disk holds;
* ``.parts/shard-<k>-of-<n>.recompute`` — while the shard is computed again (``--recompute``, an
  edited config): the shard published before stays readable until the new one replaces it,
  but is no longer this configuration's finished shard;
* the published shard, in ``loading_params.output_format``: ``shard-<k>-of-<n>/`` (HF
  ``save_to_disk``, the original's format), ``shard-<k>-of-<n>.parquet`` or
  ``shard-<k>-of-<n>.jsonl``. JSONL is the part file renamed; the Arrow formats are converted
  from it in bounded batches into a temporary sibling that is renamed at the end. Either way
  readers see the whole shard or nothing, never a moment with no shard at all.

The part file stays JSONL whatever the output format: appending a line and truncating to a
checkpoint is what makes resume cheap, and no Arrow format can be appended to like that.
Resume truncates the part file to the checkpoint's length (dropping a torn or uncheckpointed
tail) and reads on from the checkpoint's cursor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from mmirage.core.shard.disk import writing
from mmirage.core.shard.integrity import Fingerprint, describe
from mmirage.core.shard.integrity import damage as integrity_damage
from mmirage.core.shard.recovery import Locate, fits, salvage, scan_part
from mmirage.core.shard.tally import tally
from mmirage.core.writer.formats import (
    FORMATS,
    Format,
    iter_rows,
    jsonl_lines,
)
from mmirage.core.writer.helper import ARROW_FORMATS, ArrowHelper
from mmirage.rundir import (
    COUNTERS,
    atomic_write_json,
    checkpoint_path,
    part_path,
    published_path,
    shard_name,
)

logger = logging.getLogger(__name__)

OUTPUT_DIR = "loading_params.datasets[].output_dir"  # what chose the disk of these files


@dataclass
class ShardCheckpoint:
    rows_done: int = 0  # lines in the part file (good rows and error records)
    rows_failed: int = 0
    rows_retryable: int = 0  # failed rows that carry a retry marker (``retry_marker``)
    input_tokens: int = 0
    output_tokens: int = 0
    offset: int = 0  # byte length of the part file holding those rows
    range_index: int = 0  # cursor: the shard range to read next...
    next_row_id: int | None = None  # ...and the row id to start at (None: the range's start)
    complete: bool = False  # published
    fingerprint: str = ""
    # The published shard as written (``integrity``): verified before it is trusted again.
    published_size: int | None = None
    published_sha256: str | None = None

    @classmethod
    def load(cls, path: Path) -> ShardCheckpoint | None:
        """The saved checkpoint; ``None`` when there is none or it cannot be read (with a
        WARNING: the part file's complete rows are then what a resume trusts)."""
        try:
            data = orjson.loads(path.read_bytes())
            known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            return cls(**known)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            logger.warning(
                "checkpoint %s cannot be read (%s); recovering from the rows its part file holds",
                path,
                exc,
            )
            return None

    def published_as(self) -> Fingerprint | None:
        if self.published_size is None or self.published_sha256 is None:
            return None  # published before shards were fingerprinted
        return Fingerprint(self.rows_done, self.published_size, self.published_sha256)


Checkpoint = ShardCheckpoint  # kept importable; renamed apart from llm_kit.jsonl.Checkpoint


def _fsync_dir(path: Path) -> None:
    # The rename must survive a crash too, not only the file's content.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


class ShardOutput:
    """The part file, checkpoint and published shard of one (dataset, shard).

    ``output_format`` is the format a publish writes; a shard published earlier in another
    format still counts as finished (its rows exist and must not be paid for again).
    """

    def __init__(
        self, output_dir: str, shard_id: int, num_shards: int, output_format: Format = "jsonl"
    ) -> None:
        self.dir = Path(os.path.expanduser(output_dir))
        self.name = shard_name(shard_id, num_shards)
        self.format = output_format
        self.part = part_path(self.dir, self.name)
        self.checkpoint_path = checkpoint_path(self.dir, self.name)
        self._file: IO[bytes] | None = None
        # Who writes an Arrow publish: a run gives its helper process; none converts here.
        self.arrow = ArrowHelper()
        self._grown = False  # the helper was told of every checkpoint since open()

    def path_for(self, fmt: Format) -> Path:
        """Where this shard is published in ``fmt`` (HF: a directory; else one file)."""
        return published_path(self.dir, self.name, fmt)

    @property
    def published(self) -> Path:
        """The published shard: the one in ``output_format`` if there, else any other one."""
        found = self.find_published()
        return found if found is not None else self.path_for(self.format)

    def find_published(self) -> Path | None:
        """The published shard in ``output_format`` first, then in any other format."""
        for fmt in (self.format, *(f for f in FORMATS if f != self.format)):
            path = self.path_for(fmt)
            if path.is_dir() if fmt == "hf" else path.is_file():
                return path
        return None

    def local_copy(self) -> Path | None:
        """The published shard as a local file or folder to read (``find_published``); an
        object-storage output downloads it first (``remote_output``)."""
        return self.find_published()

    @property
    def recompute_marker(self) -> Path:
        return self.part.with_suffix(".recompute")

    @property
    def recomputing(self) -> bool:
        """Being computed again: what is published is an earlier computation's."""
        return self.recompute_marker.exists()

    def begin_recompute(self) -> None:
        """Start this (dataset, shard) over, from nothing: its part file and checkpoint go, the
        published shard stays readable until the new one replaces it (``_install``)."""
        if self.find_published() is not None:
            self.part.parent.mkdir(parents=True, exist_ok=True)
            with writing(self.recompute_marker, OUTPUT_DIR):
                self.recompute_marker.touch()
                _fsync_dir(self.part.parent)
        for path in (self.part, self.checkpoint_path):
            path.unlink(missing_ok=True)

    def finished(self) -> ShardCheckpoint | None:
        """The checkpoint of a published shard (counted from its rows if it was lost), or
        ``None`` when this (dataset, shard) is not published, or is being computed again.
        Publishing renames first, so the published shard, not the checkpoint's ``complete``
        flag, is what says "done"."""
        published = self.find_published()
        if published is None or self.recomputing:
            return None
        ckpt = ShardCheckpoint.load(self.checkpoint_path)
        if ckpt is None:
            ckpt = ShardCheckpoint()
            for batch in iter_rows(published):
                for row in batch:
                    tally(ckpt, row)
        ckpt.complete = True
        return ckpt

    def resume_point(self, fp: str, locate: Locate | None = None) -> ShardCheckpoint:
        """The checkpoint ``open`` resumes from: the saved one if it belongs to this config and
        fits the part file; else one rebuilt from the part file's complete rows (``locate``
        places the cursor after the last; without it, only the counters are rebuilt)."""
        ckpt = ShardCheckpoint.load(self.checkpoint_path)
        if ckpt is not None and (ckpt.complete or ckpt.fingerprint != fp):
            return ShardCheckpoint(fingerprint=fp)
        try:
            size = self.part.stat().st_size
        except FileNotFoundError:
            size = 0
        if (
            ckpt is not None
            and ckpt.offset <= size
            and fits(self.part, ckpt.offset, ckpt.rows_done)
        ):
            return ckpt
        if ckpt is not None:
            logger.warning(
                "checkpoint %s says %d bytes but its part file %s holds %d; recovering from "
                "the rows the part file holds",
                self.checkpoint_path,
                ckpt.offset,
                self.part,
                size,
            )
        return self._rebuilt(fp, locate)

    def _rebuilt(self, fp: str, locate: Locate | None) -> ShardCheckpoint:
        durable = scan_part(self.part)
        ckpt = ShardCheckpoint(fingerprint=fp)
        if durable.last_key is None:
            return ckpt
        cursor = locate(durable.last_key) if locate is not None else (0, None)
        if cursor is None:  # not this shard's rows: nothing can be trusted
            return ckpt
        ckpt.range_index, ckpt.next_row_id = cursor
        for name in (*COUNTERS, "offset"):
            setattr(ckpt, name, getattr(durable, name))
        return ckpt

    def open(self, fp: str, locate: Locate | None = None) -> ShardCheckpoint:
        """Open the part file for appending at ``resume_point`` and return that checkpoint.
        Called under the shard's lock: the temporary siblings of a killed publish (its own or
        its Arrow helper's, named by their pid) can go."""
        self.part.parent.mkdir(parents=True, exist_ok=True)
        for fmt in FORMATS:
            dest = self.path_for(fmt)
            for stale in dest.parent.glob(f".{dest.name}.tmp.*"):
                _remove(stale)
        ckpt = self.resume_point(fp, locate)
        mode = "r+b" if self.part.exists() else "w+b"
        self._file = open(self.part, mode)  # noqa: SIM115 - kept open across batches
        self._file.truncate(ckpt.offset)
        self._file.seek(ckpt.offset)
        self._grown = False
        return ckpt

    def append(self, records: list[dict[str, Any]]) -> None:
        assert self._file is not None, "open() first"
        lines = jsonl_lines(records)
        with writing(self.part, OUTPUT_DIR):
            self._file.write(lines)

    def feed_conversion(self) -> None:
        """Let the Arrow helper convert the rows appended so far, before their checkpoint:
        publishing then waits for the last group's rows only, not for a second of them. The
        conversion is only ever published after the last checkpoint, so rows that are written
        but not yet durable are safe to read."""
        if self.format not in ARROW_FORMATS or self._file is None:
            return
        with writing(self.part, OUTPUT_DIR):
            self._file.flush()  # whole lines, for the helper to read (no fsync: not durable)
        self._grow(self._file.tell())

    def checkpoint(self, ckpt: ShardCheckpoint) -> None:
        """Make the appended rows durable, then record them (in that order)."""
        assert self._file is not None, "open() first"
        with writing(self.part, OUTPUT_DIR):
            self._file.flush()
            os.fsync(self._file.fileno())
        ckpt.offset = self._file.tell()
        with writing(self.checkpoint_path, OUTPUT_DIR):
            atomic_write_json(self.checkpoint_path, asdict(ckpt))
        self._grow(ckpt.offset)  # the durable rows can be converted now, beside the run

    def _grow(self, upto: int) -> None:
        """Tell the Arrow helper the part file's first ``upto`` bytes are written."""
        dest = self.path_for(self.format)
        self._grown = self.arrow.grow(self.part, dest, self.format, upto)

    def publish(self, ckpt: ShardCheckpoint) -> None:
        """Publish the complete part file in ``output_format``, atomically.

        JSONL: a rename. HF and Parquet: a streamed conversion into a temporary sibling, renamed
        into place, then the part file is removed (a crash between the two leaves it behind,
        harmless: the published shard is what counts, and a forced rerun discards it)."""
        self.checkpoint(ckpt)
        self.close()
        self._install(ckpt)

    def start_rewrite(self) -> None:
        """Open an empty part file for a published shard's new version (``republish``)."""
        self.part.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.part, "w+b")  # noqa: SIM115 - kept open across batches
        self._grown = False

    def republish(self, ckpt: ShardCheckpoint) -> None:
        """Publish the rewritten part file in place of the published shard. The checkpoint is
        written last: a crash before it leaves the new shard under the old fingerprint, which
        ``run`` reports as damaged and ``--force-retry`` takes back whole."""
        assert self._file is not None, "start_rewrite() first"
        with writing(self.part, OUTPUT_DIR):
            self._file.flush()
            os.fsync(self._file.fileno())
        ckpt.offset = self._file.tell()
        self.close()
        self._install(ckpt)

    def _install(self, ckpt: ShardCheckpoint) -> None:
        """The part file becomes the published shard, replacing any earlier one; then the
        checkpoint says so (a crash in between: the shard counts as done, see ``finished``)."""
        dest = self.path_for(self.format)
        with writing(dest, OUTPUT_DIR):
            if self.format == "jsonl":
                os.replace(self.part, dest)
            else:
                upto = ckpt.offset if self._grown else None  # else: converted whole
                self.arrow.write(self.part, dest, self.format, upto)
                self.part.unlink(missing_ok=True)
            for fmt in FORMATS:  # an older version in another format is not this shard any more
                if fmt != self.format:
                    _remove(self.path_for(fmt))
            self.recompute_marker.unlink(missing_ok=True)
        _fsync_dir(self.dir)
        written = describe(dest, ckpt.rows_done)
        ckpt.complete = True
        ckpt.published_size, ckpt.published_sha256 = written.size, written.sha256
        with writing(self.checkpoint_path, OUTPUT_DIR):
            atomic_write_json(self.checkpoint_path, asdict(ckpt))

    def damage(self, *, full: bool = False) -> str | None:
        """Why the published shard is not what was published (one sentence naming it), or
        ``None`` when it is, or when nothing was recorded to compare with."""
        published = self.find_published()
        ckpt = ShardCheckpoint.load(self.checkpoint_path)
        expected = ckpt.published_as() if ckpt is not None else None
        if published is None or expected is None:
            return None
        problem = integrity_damage(published, expected, full=full)
        return None if problem is None else f"published shard {published} {problem}"

    def salvage(self, fp: str, locate: Locate) -> ShardCheckpoint:
        """Take a damaged published shard apart: its readable rows go back into the part
        file, the damaged file goes, and the returned checkpoint resumes after those rows."""
        published = self.find_published()
        kept = salvage(published, self.part) if published is not None else 0
        for fmt in FORMATS:
            _remove(self.path_for(fmt))
        ckpt = self._rebuilt(fp, locate)
        logger.warning(
            "%s is damaged: its first %d readable row(s) are kept, the shard resumes after them",
            published,
            kept,
        )
        atomic_write_json(self.checkpoint_path, asdict(ckpt))
        return ckpt

    def close(self) -> None:
        if self._file is not None:
            # Rows not yet checkpointed may fail to flush (a full disk): resume drops them.
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
