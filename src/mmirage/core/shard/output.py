"""One dataset's output for one shard: an append-only part file, its checkpoint, the publish.

Files, under the dataset's ``output_dir``:

* ``.parts/shard-<k>-of-<n>.jsonl`` — one JSON line per finished row, appended batch by batch;
* ``.parts/shard-<k>-of-<n>.ckpt.json`` — rows done, the part file's byte length at that point
  and where to read next; rewritten atomically after the part file is fsynced, so it never
  claims more than the disk holds;
* ``shard-<k>-of-<n>.jsonl`` — the published shard, created by renaming the complete part file
  (readers see the whole shard or nothing; the original had a window with no directory at all).

Resume truncates the part file to the checkpoint's length (dropping a torn or uncheckpointed
tail) and reads on from the checkpoint's cursor. Only JSONL is written for now; HF
``save_to_disk`` and Parquet outputs can be produced from the published file later.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from mmirage.core.shard.state import atomic_write_json


@dataclass
class Checkpoint:
    rows_done: int = 0  # lines in the part file (good rows and error records)
    rows_failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    offset: int = 0  # byte length of the part file holding those rows
    range_index: int = 0  # cursor: the shard range to read next...
    next_row_id: int | None = None  # ...and the row id to start at (None: the range's start)
    complete: bool = False  # published
    fingerprint: str = ""

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError):
            return None  # unreadable: start this dataset over (nothing is trusted)
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


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


def _default(value: Any) -> Any:
    # Sets, tuples of odd things, paths, PIL images...: keep the row, as text.
    return str(value)


class ShardOutput:
    """The part file, checkpoint and published file of one (dataset, shard)."""

    def __init__(self, output_dir: str, shard_id: int, num_shards: int) -> None:
        self.dir = Path(os.path.expanduser(output_dir))
        name = f"shard-{shard_id}-of-{num_shards}"
        self.part = self.dir / ".parts" / f"{name}.jsonl"
        self.checkpoint_path = self.dir / ".parts" / f"{name}.ckpt.json"
        self.published = self.dir / f"{name}.jsonl"
        self._file: IO[bytes] | None = None

    def discard(self) -> None:
        """Forget every result of this (dataset, shard): a forced rerun starts from nothing."""
        for path in (self.part, self.checkpoint_path, self.published):
            path.unlink(missing_ok=True)

    def finished(self) -> Checkpoint | None:
        """The checkpoint of a published shard (counted from the file if it was lost), or
        ``None`` when this (dataset, shard) is not published. Publishing renames first, so the
        published file, not the checkpoint's ``complete`` flag, is what says "done"."""
        if not self.published.exists():
            return None
        ckpt = Checkpoint.load(self.checkpoint_path)
        if ckpt is None:
            ckpt = Checkpoint()
            with open(self.published, "rb") as f:
                for line in f:
                    ckpt.rows_done += 1
                    row = orjson.loads(line)
                    ckpt.rows_failed += bool(row.get("__errors__"))
                    usage = row.get("__usage__") or {}
                    ckpt.input_tokens += int(usage.get("input_tokens") or 0)
                    ckpt.output_tokens += int(usage.get("output_tokens") or 0)
        ckpt.complete = True
        return ckpt

    def open(self, fp: str) -> Checkpoint:
        """Open the part file for appending at the last checkpoint and return that checkpoint
        (a fresh one when there is none, or it belongs to another config)."""
        self.part.parent.mkdir(parents=True, exist_ok=True)
        ckpt = Checkpoint.load(self.checkpoint_path)
        if ckpt is None or ckpt.complete or ckpt.fingerprint != fp:
            ckpt = Checkpoint(fingerprint=fp)
        mode = "r+b" if self.part.exists() else "w+b"
        self._file = open(self.part, mode)  # noqa: SIM115 - kept open across batches
        if self._file.seek(0, os.SEEK_END) < ckpt.offset:
            # The part file lost checkpointed rows (deleted or truncated by hand): start over.
            ckpt = Checkpoint(fingerprint=fp)
        self._file.truncate(ckpt.offset)
        self._file.seek(ckpt.offset)
        return ckpt

    def append(self, records: list[dict[str, Any]]) -> None:
        assert self._file is not None, "open() first"
        opts = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
        self._file.write(b"".join(orjson.dumps(r, default=_default, option=opts) for r in records))

    def checkpoint(self, ckpt: Checkpoint) -> None:
        """Make the appended rows durable, then record them (in that order)."""
        assert self._file is not None, "open() first"
        self._file.flush()
        os.fsync(self._file.fileno())
        ckpt.offset = self._file.tell()
        atomic_write_json(self.checkpoint_path, asdict(ckpt))

    def publish(self, ckpt: Checkpoint) -> None:
        """Rename the complete part file to the published name (atomic on one filesystem)."""
        self.checkpoint(ckpt)
        self.close()
        os.replace(self.part, self.published)
        _fsync_dir(self.dir)
        ckpt.complete = True
        atomic_write_json(self.checkpoint_path, asdict(ckpt))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
