"""What a published shard must still hold: its row count, byte size and SHA-256, recorded at
publish in the shard's checkpoint, verified before anyone trusts the shard again.

``run`` and ``check`` verify cheaply (size, then the row count: for JSONL one pass counting
newlines, for Parquet its footer, for HF its Arrow files' batch lengths); ``merge``, which
reads the whole shard anyway, also compares the checksum. A published shard that fails is
"damaged": a truncated or edited file must never pass for a finished one (its missing rows
would be lost without a word).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Fingerprint:
    """The published shard as written: rows, bytes and SHA-256 (HF: over its files)."""

    rows: int
    size: int
    sha256: str


def files_of(path: Path) -> list[Path]:
    """The files that make up a published shard, in a fixed order."""
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return [path]


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in files_of(path))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    for file in files_of(path):
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def describe(path: Path, rows: int) -> Fingerprint:
    return Fingerprint(rows, size_of(path), sha256_of(path))


def count_rows(path: Path) -> int | None:
    """The rows a published shard holds, as cheaply as its format allows (``None``: the
    file cannot be read)."""
    try:
        if path.is_dir():
            return _hf_rows(path)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return int(pq.ParquetFile(str(path)).metadata.num_rows)
        lines = 0
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                lines += chunk.count(b"\n")
        return lines
    except Exception:  # any unreadable file is damaged, whatever the reader raises
        return None


def _hf_rows(path: Path) -> int:
    import pyarrow as pa

    rows = 0
    for file in sorted(path.rglob("*.arrow")):
        with pa.memory_map(str(file)) as source:
            rows += sum(batch.num_rows for batch in pa.ipc.open_stream(source))
    return rows


def damage(path: Path, expected: Fingerprint, *, full: bool = False) -> str | None:
    """Why ``path`` no longer is the shard that was published, or ``None`` when it is
    (``full``: also compare the checksum)."""
    size = size_of(path)
    if size != expected.size:
        return f"holds {size} bytes, {expected.size} were published"
    rows = count_rows(path)
    if rows != expected.rows:
        held = "cannot be read" if rows is None else f"holds {rows} rows"
        return f"{held}, {expected.rows} were published"
    if full and sha256_of(path) != expected.sha256:
        return "was changed since it was published (its checksum differs)"
    return None
