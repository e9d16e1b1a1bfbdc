"""Reading shard outputs and writing a dataset as JSONL, Parquet or an HF ``save_to_disk`` dir.

Everything streams in batches of ``BATCH_ROWS`` rows: no format ever holds a whole dataset in
Python memory. The Arrow formats need one schema for the whole file, known before the first
batch is written: they write under the first batch's schema while every later batch fits it
(one pass, the common case); a batch that does not makes them read the rows twice, a first
pass inferring the whole schema (``schema_inference``: ``null`` becomes any type, ``int``
widens to ``float``, struct fields are merged) and a second one writing. A column whose values
cannot share one Arrow type (``3`` in one row, ``"3"`` in another) is written as JSON text
rather than failing the merge; ``Schema.json_columns`` names them.

``pyarrow`` and ``datasets`` are imported inside the functions: ``mmirage --help`` stays fast.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import orjson

from mmirage.core.writer.arrow_columns import plain_array
from mmirage.core.writer.hf_layout import (
    HfLayout,
    datasets_installed,
    iter_saved,
    unmapped_columns,
)
from mmirage.core.writer.schema_inference import Schema, SchemaInference, infer_schema
from mmirage.errors import WorkFailed, require_extra
from mmirage.rundir import ROW_KEY

Format = Literal["hf", "jsonl", "parquet"]
FORMATS: tuple[Format, ...] = ("hf", "jsonl", "parquet")
BATCH_ROWS = 1000

# Where a format puts a dataset whose base path is P: HF is a directory, the others one file.
SUFFIX: dict[str, str] = {"hf": "", "jsonl": ".jsonl", "parquet": ".parquet"}

Batches = Callable[[], Iterator[list[dict[str, Any]]]]
"""A re-iterable source of row batches (the Arrow formats may read it twice)."""
_ArrowWriter = Callable[[Iterator[list[dict[str, Any]]], Schema, Path], None]


class FormatError(WorkFailed):
    """A shard cannot be read or the dataset cannot be written; ``str(err)`` says where."""


def target_path(base: Path, fmt: Format) -> Path:
    return base.with_name(base.name + SUFFIX[fmt])


_JSONL = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def jsonl_lines(rows: Iterable[Any]) -> bytearray:
    """``rows`` as JSONL (values JSON cannot hold as text), in one buffer: orjson's outputs
    kept alive in a list to join cost several times their making (measured: 2.5 vs 0.45 µs
    a row, a file write included)."""
    lines = bytearray()
    for row in rows:
        lines += orjson.dumps(row, default=str, option=_JSONL)
    return lines


def iter_jsonl(path: Path, batch_rows: int = BATCH_ROWS) -> Iterator[list[dict[str, Any]]]:
    """A published JSONL shard's rows, in file order, ``batch_rows`` at a time."""
    with open(path, "rb") as f:
        yield from jsonl_batches(f, path, batch_rows)


def jsonl_batches(
    lines: Iterable[bytes], path: Path, batch_rows: int = BATCH_ROWS
) -> Iterator[list[dict[str, Any]]]:
    """The JSON object of each of ``lines`` (the lines of ``path``; blank ones skipped),
    ``batch_rows`` at a time."""
    batch: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise FormatError(f"line {number} of {path} is not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise FormatError(f"line {number} of {path} is not a JSON object")
        batch.append(row)
        if len(batch) >= batch_rows:
            yield batch
            batch = []
    if batch:
        yield batch


def iter_parquet(path: Path, batch_rows: int = BATCH_ROWS) -> Iterator[list[dict[str, Any]]]:
    """A Parquet file's rows, read ``batch_rows`` at a time (never the whole file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        reader = pq.ParquetFile(str(path))
    except (OSError, pa.ArrowInvalid) as exc:
        raise FormatError(f"{path} is not a readable Parquet file ({exc})") from None
    with reader:
        for record_batch in reader.iter_batches(batch_size=batch_rows):
            yield record_batch.to_pylist()


def format_of(path: Path) -> Format:
    """The format of a written dataset, from its name: a directory is HF ``save_to_disk``."""
    if path.is_dir():
        return "hf"
    return "parquet" if path.suffix == ".parquet" else "jsonl"


def iter_rows(path: Path, batch_rows: int = BATCH_ROWS) -> Iterator[list[dict[str, Any]]]:
    """The rows of a dataset written in any of ``FORMATS``, in batches."""
    readers = {"hf": iter_hf, "parquet": iter_parquet, "jsonl": iter_jsonl}
    return readers[format_of(path)](path, batch_rows)


def iter_hf(path: Path, batch_rows: int = BATCH_ROWS) -> Iterator[list[dict[str, Any]]]:
    """An HF ``save_to_disk`` directory's rows (memory-mapped; a DatasetDict split by split).
    Without ``datasets`` (the ``hf`` extra), pyarrow reads the same files."""
    if not datasets_installed():
        try:
            yield from iter_saved(path, batch_rows)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # ArrowInvalid: a ValueError
            raise FormatError(f"{path} is not a dataset saved with save_to_disk ({exc})") from None
        return
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise FormatError(f"{path} is not a dataset saved with save_to_disk ({exc})") from None
    parts = loaded.values() if isinstance(loaded, datasets.DatasetDict) else [loaded]
    for part in parts:
        for record_batch in part.data.to_batches(max_chunksize=batch_rows):
            yield record_batch.to_pylist()


def _dumps(value: Any) -> bytes:
    opts = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
    return orjson.dumps(value, default=str, option=opts)


def to_arrow(batch: list[dict[str, Any]], schema: Schema) -> Any:
    """One batch as a ``pyarrow.RecordBatch`` of ``schema`` (missing columns: null)."""
    import pyarrow as pa

    json_columns = set(schema.json_columns)
    arrays = []
    for f in schema.arrow:
        values = [row.get(f.name) for row in batch]
        if f.name in json_columns:
            values = [None if v is None else _dumps(v).decode() for v in values]
        try:
            built = plain_array(values, f.type)
            arrays.append(pa.array(values, type=f.type) if built is None else built)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise FormatError(f"column {f.name!r} cannot be written as {f.type}: {exc}") from None
    return pa.RecordBatch.from_arrays(arrays, schema=schema.arrow)


def _replace(tmp: Path, dest: Path) -> None:
    """Put ``tmp`` at ``dest``; an existing directory is moved aside first, then removed."""
    old: Path | None = None
    if dest.is_dir() and not dest.is_symlink():
        old = dest.with_name(f".{dest.name}.old.{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_dataset(batches: Batches, dest: Path, fmt: Format) -> Schema | None:
    """Write every row of ``batches()`` to ``dest`` in ``fmt``, atomically (a temporary
    sibling renamed at the end: readers see the old dataset or the new one). Returns the
    schema for the Arrow formats."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.tmp.{os.getpid()}")
    _remove(tmp)
    try:
        schema = None
        if fmt == "jsonl":
            _write_jsonl(batches(), tmp)
        elif fmt not in _ARROW_WRITERS:
            raise FormatError(f"unknown output format {fmt!r}; use one of {FORMATS}")
        else:
            schema = _write_arrow(batches, tmp, _ARROW_WRITERS[fmt])
        _fsync_tree(tmp)
        _replace(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise
    return schema


def _write_arrow(batches: Batches, tmp: Path, write: _ArrowWriter) -> Schema:
    """One pass while the schema holds: the first batch's schema is written under, and
    each later batch is checked against it as it comes (most shards are uniform). A batch
    that changes it (a new column, a first failed row, ints then floats) sends the rows
    through twice: the whole schema first, then the write."""
    source = batches()
    try:
        first = next(source, None)
        if first is not None:
            inference = SchemaInference()
            inference.add(first)
            schema = _not_empty(inference.schema())
            changed = False

            def fitting() -> Iterator[list[dict[str, Any]]]:
                nonlocal changed
                yield first
                for batch in source:
                    if inference.add(batch):
                        changed = True  # what was written so far is thrown away
                        return
                    yield batch

            write(fitting(), schema, tmp)
            if not changed:
                return schema
            _remove(tmp)
    finally:
        close = getattr(source, "close", None)  # a generator holds its file open
        if close is not None:
            close()
    schema = _not_empty(infer_schema(batches()))
    write(batches(), schema, tmp)
    return schema


def _not_empty(schema: Schema) -> Schema:
    """A schema with at least one column: a shard with no rows has no inferred columns, and an
    HF dataset without columns cannot be saved and loaded back. ``__row_key__`` is the column
    every pipeline row has."""
    import pyarrow as pa

    if len(schema.arrow) > 0:
        return schema
    return Schema(pa.schema([(ROW_KEY, pa.string())]), schema.json_columns)


def _fsync_tree(path: Path) -> None:
    """Flush a written file, or every file of a written directory, to disk before the rename
    that publishes it: after a power loss the new name must not point at missing data."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_jsonl(batches: Iterator[list[dict[str, Any]]], path: Path) -> None:
    with open(path, "wb") as f:
        for batch in batches:
            f.write(jsonl_lines(batch))


def _write_parquet(batches: Iterator[list[dict[str, Any]]], schema: Schema, path: Path) -> None:
    import pyarrow.parquet as pq

    with pq.ParquetWriter(str(path), schema.arrow) as writer:
        for batch in batches:
            writer.write_batch(to_arrow(batch, schema))


def _write_hf(batches: Iterator[list[dict[str, Any]]], schema: Schema, path: Path) -> None:
    # The rows go to an Arrow stream file, what datasets itself writes. When datasets would
    # write it as it is, the stream becomes the data file of the directory (``hf_layout``: no
    # datasets import); else Dataset.from_file memory-maps it and save_to_disk copies it into
    # the standard layout. Either way the rows never sit in Python memory.
    import pyarrow as pa

    layout = HfLayout.for_schema(schema.arrow)
    if layout is None and not datasets_installed():
        # The LLM calls are paid for by now: a column the layout cannot describe is written
        # as JSON text rather than failing the publish for want of the hf extra.
        _as_json_text(schema, unmapped_columns(schema.arrow))
        layout = HfLayout.for_schema(schema.arrow)
    stream = path.with_name(path.name + ".arrow")
    rows: list[int] = []
    nbytes = 0
    try:
        arrow_schema = schema.arrow if layout is None else layout.arrow
        with pa.OSFile(str(stream), "wb") as sink, pa.ipc.new_stream(sink, arrow_schema) as w:
            for batch in batches:
                record_batch = to_arrow(batch, schema)
                rows.append(record_batch.num_rows)
                nbytes += record_batch.nbytes
                w.write_batch(record_batch)
        # Without datasets, the layout is written at any size: load_from_disk reads one file.
        if layout is not None and (
            HfLayout.fits_one_file(rows, nbytes, layout.writer_rows) or not datasets_installed()
        ):
            layout.install(stream, path)
        else:
            _save_with_datasets(stream, path)
    finally:
        stream.unlink(missing_ok=True)


_ARROW_WRITERS: dict[str, _ArrowWriter] = {"parquet": _write_parquet, "hf": _write_hf}


def _as_json_text(schema: Schema, columns: list[str]) -> None:
    """Make ``columns`` of ``schema`` JSON text, in place: the caller reports ``json_columns``."""
    import pyarrow as pa

    for name in columns:
        at = schema.arrow.get_field_index(name)
        schema.arrow = schema.arrow.set(at, pa.field(name, pa.string()))
    schema.json_columns = sorted({*schema.json_columns, *columns})


def _published_path(tmp: Path) -> Path:
    """The destination that the temporary ``tmp`` of ``write_dataset`` becomes: what a message
    names (the temporary name means nothing to the user)."""
    name = tmp.name.removeprefix(".").rpartition(".tmp.")[0]
    return tmp.with_name(name or tmp.name)


def _save_with_datasets(stream: Path, path: Path) -> None:
    feature = f"writing {_published_path(path)} as an HF dataset"
    datasets = require_extra("datasets", "hf", feature)
    from llm_kit.hf_datasets import quiet_datasets  # pydantic et al.: not at mmirage's start

    dataset = datasets.Dataset.from_file(str(stream))
    # No rows would make save_to_disk write zero Arrow files, which load_from_disk rejects.
    shards = 1 if dataset.num_rows == 0 else None
    with quiet_datasets(datasets):
        dataset.save_to_disk(str(path), num_shards=shards)
    del dataset  # drop the memory map before the file goes
