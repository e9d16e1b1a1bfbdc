"""HF shards written with pyarrow alone (``hf_layout``) are byte for byte what ``datasets``'
``save_to_disk`` writes (state.json aside: datasets draws a new fingerprint at every save), and a
publish of the common kinds of rows does not import ``datasets``."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from mmirage.core.writer import formats
from mmirage.core.writer.hf_layout import HfLayout

CASES: dict[str, list[dict[str, Any]]] = {
    "flat": [{"id": i, "t": f"r{i}", "e": None, "u": {"a": i, "b": 2}} for i in range(2500)],
    "nested": [
        {
            "l": [i, i + 1],
            "ls": [{"x": 1.5, "y": None}] if i % 3 else [],
            "m": {"k": "v"} if i % 2 else None,
            "f": i / 3,
            "b": i % 2 == 0,
            "text": "é ✓ 漢字",
        }
        for i in range(1200)
    ],
    "json_text": [{"v": i if i % 2 else str(i), "w": [1] if i % 5 else None} for i in range(1500)],
    "empty": [],
    "whole_batches": [{"a": i} for i in range(3000)],
    "null_lists": [{"a": [None], "b": {}} for _ in range(10)],
    "parquet_types": [  # what rows read from Parquet inputs hold
        {
            "when": dt.datetime(2024, 1, 2, 3, 4, 5, i),
            "utc": dt.datetime(2024, 1, 2, tzinfo=dt.UTC),
            "day": dt.date(2024, 5, 1 + i % 28),
            "at": dt.time(12, 30),
            "took": dt.timedelta(seconds=i),
            "raw": bytes([i % 256]),
            "price": Decimal(f"{i}.25"),
            "days": [dt.date(2023, 1, 1)],
        }
        for i in range(1100)
    ],
}


def _batches(rows: list[dict[str, Any]], size: int = formats.BATCH_ROWS) -> formats.Batches:
    def batches() -> Iterator[list[dict[str, Any]]]:
        for start in range(0, len(rows), size):
            yield rows[start : start + size]

    return batches


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "state.json"}


def _with_datasets(monkeypatch: pytest.MonkeyPatch, batches: formats.Batches, dest: Path) -> None:
    with monkeypatch.context() as m:
        m.setattr(HfLayout, "for_schema", classmethod(lambda cls, schema: None))
        formats.write_dataset(batches, dest, "hf")


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_bytes_as_save_to_disk(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    batches = _batches(CASES[case])
    formats.write_dataset(batches, tmp_path / "direct", "hf")
    _with_datasets(monkeypatch, batches, tmp_path / "datasets")
    direct, reference = _files(tmp_path / "direct"), _files(tmp_path / "datasets")
    assert direct.keys() == reference.keys()
    for name in direct:
        assert direct[name] == reference[name], name
    loaded = datasets.load_from_disk(str(tmp_path / "direct"))
    assert loaded.to_list() == datasets.load_from_disk(str(tmp_path / "datasets")).to_list()
    states = [json.loads((tmp_path / d / "state.json").read_text()) for d in ("direct", "datasets")]
    for state in states:
        assert len(state.pop("_fingerprint")) == 16
    assert states[0] == states[1]


def test_batches_of_other_sizes_are_left_to_datasets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # datasets writes 1000-row batches whatever it is given: a merge's short batches differ.
    batches = _batches(CASES["flat"], size=300)
    formats.write_dataset(batches, tmp_path / "direct", "hf")
    _with_datasets(monkeypatch, batches, tmp_path / "datasets")
    assert _files(tmp_path / "direct") == _files(tmp_path / "datasets")


def test_what_datasets_would_write_otherwise_is_left_to_it() -> None:
    assert HfLayout.fits_one_file([1000, 1000, 7], 10_000)
    assert HfLayout.fits_one_file([], 0)
    assert not HfLayout.fits_one_file([300, 300], 10_000)  # rebatched to 1000 rows
    assert not HfLayout.fits_one_file([1000], 10**9)  # several files, smaller batches


def test_publishing_an_hf_shard_does_not_import_datasets(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from mmirage.core.writer import formats\n"
        "rows = [{'id': i, 'answer': f'a{i}', '__errors__': None} for i in range(1500)]\n"
        f"dest = Path({str(tmp_path / 'shard')!r})\n"
        "formats.write_dataset(lambda: iter([rows[:1000], rows[1000:]]), dest, 'hf')\n"
        "assert (dest / 'data-00000-of-00001.arrow').is_file()\n"
        "print('datasets' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_type_only_datasets_knows_is_left_to_it() -> None:
    import pyarrow as pa

    interval = pa.month_day_nano_interval()
    assert HfLayout.for_schema(pa.schema([("t", interval)])) is None
    nested = pa.struct([("ok", pa.string()), ("span", interval)])
    assert HfLayout.for_schema(pa.schema([("row", nested)])) is None
    assert HfLayout.for_schema(pa.schema([("items", pa.list_(interval))])) is None
    plain = HfLayout.for_schema(pa.schema([("text", pa.string()), ("n", pa.int64())]))
    assert plain is not None and set(plain.features) == {"text", "n"}
