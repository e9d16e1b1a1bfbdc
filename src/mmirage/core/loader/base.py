"""What every reader yields and promises: rows with stable ids, bad-row records, one error type."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Literal

from mmirage.errors import UserError

if TYPE_CHECKING:
    from mmirage.config.loading_params import DatasetConfig

Opener = Callable[[str], IO[bytes]]
"""Opens a data file for binary reading: ``open_local``, or an object store's ``open``."""


def open_local(path: str) -> IO[bytes]:
    return open(path, "rb")


OnBadRow = Literal["fail", "skip"]
"""``fail``: raise ``DataError`` at the first malformed row; ``skip``: report it and go on."""


class DataError(UserError):
    """Input data that cannot be read: a missing path, a file that is not what the config says,
    or (with ``on_bad_row="fail"``) a malformed row. ``str(err)`` is one sentence."""


@dataclass(slots=True)  # not frozen: that doubles the cost of making one, and rows are many
class Row:
    """One input row. ``row_id`` is its position in the dataset (per split for split datasets):
    the same on every run and for every shard layout."""

    row_id: int
    data: dict[str, Any]
    split: str | None = None


@dataclass(frozen=True, slots=True)
class BadRow:
    """A row skipped under ``on_bad_row="skip"``, for the pipeline's errors file.
    ``line`` is the 1-based physical line number in ``file``."""

    file: str
    line: int
    error: str
    row_id: int
    split: str | None = None


BadRowSink = Callable[[BadRow], object]
"""Receives each skipped row as it is met (e.g. ``list.append``) so nothing accumulates here."""


def report_bad_row(bad: BadRow, on_bad_row: OnBadRow, bad_rows: BadRowSink | None) -> None:
    """Stop at a malformed row (``fail``) or hand it to ``bad_rows`` (``skip``): either way the
    row keeps its id, so that the rows after it keep theirs."""
    if on_bad_row == "fail":
        raise DataError(
            f"{bad.file}, line {bad.line}: {bad.error}; fix or remove the line, "
            "or set loading_params.on_bad_row: skip to record bad lines and go on"
        )
    if bad_rows is not None:
        bad_rows(bad)


def check_bounds(start: int, stop: int | None, num_rows: int | None) -> tuple[int, int | None]:
    """Validate a ``[start, stop)`` request; ``stop`` is clamped to ``num_rows`` when known."""
    if start < 0 or (stop is not None and stop < 0):
        raise ValueError(f"row range must be non-negative, got start={start}, stop={stop}")
    if num_rows is not None:
        stop = num_rows if stop is None else min(stop, num_rows)
    return start, stop


class RowReader(ABC):
    """One ordered sequence of rows: a file, one split of a dict, a saved ``Dataset``."""

    def __init__(self, split: str | None) -> None:
        self.split = split

    @property
    @abstractmethod
    def num_rows(self) -> int:
        """Number of row ids in this sequence (computed once, cheaply where the format allows)."""

    @abstractmethod
    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        on_bad_row: OnBadRow = "fail",
        bad_rows: BadRowSink | None = None,
    ) -> Iterator[Row]:
        """Rows with ``start <= row_id < stop``, in order, streamed."""


@dataclass
class DatasetSource:
    """One ``loading_params.datasets[i]`` entry, opened: one reader per split (key ``None`` for a
    dataset without splits). Splits keep the order of the config / the saved ``DatasetDict``."""

    index: int
    config: DatasetConfig
    readers: dict[str | None, RowReader] = field(default_factory=dict)

    @property
    def splits(self) -> list[str | None]:
        return list(self.readers)

    @property
    def has_splits(self) -> bool:
        return None not in self.readers

    @property
    def output_dir(self) -> str:
        return self.config.output_dir

    @property
    def image_base_path(self) -> str | None:
        # Carried through only: image inputs are resolved by the variable extractor.
        return self.config.image_base_path

    @property
    def num_rows(self) -> int:
        """All rows, every split included."""
        return sum(reader.num_rows for reader in self.readers.values())

    def reader(self, split: str | None = None) -> RowReader:
        if split in self.readers:
            return self.readers[split]
        if split is None:
            names = ", ".join(repr(s) for s in self.readers)
            raise ValueError(f"dataset {self.index} has splits ({names}); pass split=<name>")
        raise ValueError(f"dataset {self.index} has no split {split!r}")

    def iter_rows(
        self,
        start: int = 0,
        stop: int | None = None,
        *,
        split: str | None = None,
        on_bad_row: OnBadRow = "fail",
        bad_rows: BadRowSink | None = None,
    ) -> Iterator[Row]:
        """Rows ``[start, stop)`` of one split (``split=None`` for a dataset without splits)."""
        return self.reader(split).iter_rows(start, stop, on_bad_row=on_bad_row, bad_rows=bad_rows)
