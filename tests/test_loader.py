"""Streaming dataset readers: row ids, shards, bad rows, path errors, for every format."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mmirage.config.loading_params import DatasetConfig
from mmirage.core.loader import (
    BadRow,
    DataError,
    DatasetSource,
    Row,
    open_dataset,
    open_datasets,
    plan_shard,
    shard_dataset,
    shard_range,
)
from mmirage.core.loader import jsonl as jsonl_mod
from mmirage.core.loader.jsonl import JsonlReader


def _cfg(path: str | dict[str, str], type_: str = "JSONL", out: str = "out") -> DatasetConfig:
    return DatasetConfig(path=path, type=type_, output_dir=out)  # type: ignore[arg-type]


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


def _ids(rows: list[Row]) -> list[int]:
    return [r.row_id for r in rows]


def _all_shards(source: DatasetSource, num_shards: int) -> list[Row]:
    rows: list[Row] = []
    for k in range(num_shards):
        rows.extend(shard_dataset(source, num_shards, k).iter_rows())
    return rows


# --- sharding -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("num_rows", "num_shards"), [(10, 3), (7, 7), (3, 5), (0, 2), (101, 8)])
def test_shard_range_matches_hf_contiguous_shard(num_rows: int, num_shards: int) -> None:
    import datasets

    ds = datasets.Dataset.from_dict({"i": list(range(num_rows))})
    covered: list[int] = []
    for k in range(num_shards):
        start, stop = shard_range(num_rows, num_shards, k)
        if start == stop == num_rows > 0:
            # HF raises IndexError for an empty shard past the end; ours is simply empty.
            continue
        assert list(range(start, stop)) == ds.shard(num_shards, k, contiguous=True)["i"]
        covered.extend(range(start, stop))
    assert covered == list(range(num_rows))


def test_shard_range_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="shard_id"):
        shard_range(10, 2, 2)
    with pytest.raises(ValueError, match="num_shards"):
        shard_range(10, 0, 0)


# --- JSONL --------------------------------------------------------------------------------------


def test_jsonl_rows_blank_lines_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(
        b'\xef\xbb\xbf{"a": 0}\n\n   \n{"a": 1}\r\n\t\r\n{"a": 2}\n{"a": 3}'  # no final newline
    )
    source = open_dataset(_cfg(str(path)))
    assert source.num_rows == 4  # blank / whitespace-only lines take no row id
    rows = list(source.iter_rows())
    assert [(r.row_id, r.data["a"], r.split) for r in rows] == [(i, i, None) for i in range(4)]
    assert [r.data["a"] for r in source.iter_rows(2, 3)] == [2]
    assert source.output_dir == "out" and not source.has_splits


def test_jsonl_shards_union_is_the_dataset_for_any_layout(tmp_path: Path) -> None:
    # Blank lines, long lines and a tiny block size put checkpoints mid-way through the data.
    lines = []
    for i in range(97):
        lines.append(json.dumps({"i": i, "pad": "x" * (i % 13) * 7}))
        if i % 10 == 3:
            lines.append("")
        if i % 17 == 5:
            lines.append("  \t")
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for block_size in (16, 64, 1 << 20):
        reader = JsonlReader(str(path), block_size=block_size)
        assert reader.num_rows == 97
        whole = list(reader.iter_rows())
        assert [(r.row_id, r.data["i"]) for r in whole] == [(i, i) for i in range(97)]
        for num_shards in (1, 2, 5, 97, 120):
            parts = [
                list(reader.iter_rows(*shard_range(97, num_shards, k))) for k in range(num_shards)
            ]
            assert [r for part in parts for r in part] == whole


def test_jsonl_split_dict_has_ids_per_split(tmp_path: Path) -> None:
    train = _write_jsonl(tmp_path / "train.jsonl", [{"x": i} for i in range(5)])
    test = _write_jsonl(tmp_path / "test.jsonl", [{"x": 100 + i} for i in range(3)])
    source = open_dataset(_cfg({"train": train, "test": test}))
    assert source.has_splits and source.splits == ["train", "test"]
    assert source.num_rows == 8
    assert [(r.split, r.row_id, r.data["x"]) for r in source.iter_rows(split="test")] == [
        ("test", 0, 100),
        ("test", 1, 101),
        ("test", 2, 102),
    ]
    with pytest.raises(ValueError, match="pass split="):
        list(source.iter_rows())
    shard = shard_dataset(source, 2, 1)  # each split is sharded on its own, like the original
    assert [(r.split, r.start, r.stop) for r in shard.ranges] == [("train", 3, 5), ("test", 2, 3)]
    assert [(r.split, r.row_id) for r in shard.iter_rows()] == [
        ("train", 3),
        ("train", 4),
        ("test", 2),
    ]
    union = _all_shards(source, 3)  # per split, the shards cover it in order, no overlap
    for split, count in (("train", 5), ("test", 3)):
        assert [r.row_id for r in union if r.split == split] == list(range(count))
    assert len(union) == 8


def _bad_file(tmp_path: Path) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 0}\n{"a": 1,}\n\n[1, 2]\n{"a": 4}\n', encoding="utf-8")
    return str(path)


def test_bad_line_fails_with_file_and_line(tmp_path: Path) -> None:
    source = open_dataset(_cfg(_bad_file(tmp_path)))
    with pytest.raises(DataError, match=r"bad\.jsonl, line 2: not valid JSON") as err:
        list(source.iter_rows())
    assert str(err.value).count(".") >= 1 and "\n" not in str(err.value)
    # Starting after the first bad line meets the next one, with its physical line number.
    with pytest.raises(DataError, match=r"line 4: expected a JSON object, got an array"):
        list(source.iter_rows(2))


def test_bad_lines_skipped_and_recorded_keep_row_ids(tmp_path: Path) -> None:
    path = _bad_file(tmp_path)
    source = open_dataset(_cfg(path))
    assert source.num_rows == 4  # bad lines still own a row id; the blank line does not
    bad: list[BadRow] = []
    rows = list(source.iter_rows(on_bad_row="skip", bad_rows=bad.append))
    assert [(r.row_id, r.data["a"]) for r in rows] == [(0, 0), (3, 4)]
    assert [(b.file, b.line, b.row_id) for b in bad] == [(path, 2, 1), (path, 4, 2)]
    assert "not valid JSON" in bad[0].error and "array" in bad[1].error
    # The same bad row is reported by the shard that owns it, and only by it.
    bad2: list[BadRow] = []
    for k in range(3):
        list(shard_dataset(source, 3, k).iter_rows(on_bad_row="skip", bad_rows=bad2.append))
    assert bad2 == bad


def test_late_shard_of_large_jsonl_parses_only_its_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("w", encoding="utf-8") as f:
        f.writelines(f'{{"i": {i}}}\n' for i in range(200_000))
    parsed = 0
    real = jsonl_mod._loads

    def counting(raw: bytes) -> Any:
        nonlocal parsed
        parsed += 1
        return real(raw)

    monkeypatch.setattr(jsonl_mod, "_loads", counting)
    source = open_dataset(_cfg(str(path)))
    assert source.num_rows == 200_000 and parsed == 0  # counting never parses
    shard = shard_dataset(source, 8, 7)
    rows = list(shard.iter_rows())
    assert parsed == len(rows) == 25_000
    assert rows[0].row_id == rows[0].data["i"] == 175_000
    assert rows[-1].row_id == 199_999


# --- Parquet ------------------------------------------------------------------------------------


def _write_parquet(path: Path, start: int, count: int, row_group_size: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"i": list(range(start, start + count)), "s": [f"r{i}" for i in range(count)]})
    pq.write_table(table, path, row_group_size=row_group_size)


def test_parquet_file_and_directory_shards(tmp_path: Path) -> None:
    single = tmp_path / "one.parquet"
    _write_parquet(single, 0, 50, row_group_size=7)
    source = open_dataset(_cfg(str(single), "parquet"))
    assert source.num_rows == 50
    assert [(r.row_id, r.data["i"]) for r in source.iter_rows(12, 16)] == [
        (i, i) for i in range(12, 16)
    ]
    folder = tmp_path / "many"
    folder.mkdir()
    _write_parquet(folder / "part-0.parquet", 0, 30, row_group_size=8)
    _write_parquet(folder / "part-1.parquet", 30, 25, row_group_size=8)
    (folder / "README.txt").write_text("not data", encoding="utf-8")
    source = open_dataset(_cfg(str(folder), "parquet"))
    assert source.num_rows == 55
    whole = list(source.iter_rows())
    assert [(r.row_id, r.data["i"]) for r in whole] == [(i, i) for i in range(55)]
    for num_shards in (2, 4, 9):
        assert _all_shards(source, num_shards) == whole


def test_parquet_late_rows_skip_earlier_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "rg.parquet"
    _write_parquet(path, 0, 100, row_group_size=10)
    asked: list[list[int]] = []
    real = pq.ParquetFile.iter_batches

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(list(kwargs["row_groups"]))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    rows = list(open_dataset(_cfg(str(path), "parquet")).iter_rows(75, 92))
    assert _ids(rows) == list(range(75, 92))
    assert asked == [[7, 8, 9]]


# --- loadable -----------------------------------------------------------------------------------


def test_loadable_dataset_and_dataset_dict(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict(
        {"i": list(range(23)), "t": [f"t{i}" for i in range(23)]}
    ).save_to_disk(str(tmp_path / "ds"))
    source = open_dataset(_cfg(str(tmp_path / "ds"), "loadable"))
    assert source.splits == [None] and source.num_rows == 23
    whole = list(source.iter_rows())
    assert [(r.row_id, r.data) for r in whole] == [(i, {"i": i, "t": f"t{i}"}) for i in range(23)]
    for num_shards in (1, 4, 23, 30):
        assert _all_shards(source, num_shards) == whole

    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"i": list(range(6))}),
            "validation": datasets.Dataset.from_dict({"i": [10, 11]}),
        }
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    source = open_dataset(_cfg(str(tmp_path / "dd"), "loadable"))
    assert source.splits == ["train", "validation"] and source.num_rows == 8
    assert [
        (r.split, r.row_id, r.data["i"]) for r in source.iter_rows(1, 5, split="validation")
    ] == [("validation", 1, 11)]
    shard = shard_dataset(source, 2, 0)
    assert [(r.split, r.row_id) for r in shard.iter_rows()] == [
        ("train", 0),
        ("train", 1),
        ("train", 2),
        ("validation", 0),
    ]


# --- several datasets, errors, import cost --------------------------------------------------------


def test_plan_shard_keeps_each_dataset_with_its_output_dir(tmp_path: Path) -> None:
    a = _write_jsonl(tmp_path / "a.jsonl", [{"v": i} for i in range(10)])
    b = _write_jsonl(tmp_path / "b.jsonl", [{"v": i} for i in range(3)])
    sources = open_datasets([_cfg(a, out="out_a"), _cfg(b, out="out_b")])
    plan = plan_shard(sources, 4, 3)
    assert [(s.dataset_index, s.output_dir) for s in plan] == [(0, "out_a"), (1, "out_b")]
    assert [[(r.start, r.stop) for r in s.ranges] for s in plan] == [[(8, 10)], [(3, 3)]]
    assert [_ids(list(s.iter_rows())) for s in plan] == [[8, 9], []]


def test_missing_and_wrong_paths_name_index_path_and_fix(tmp_path: Path) -> None:
    good = _write_jsonl(tmp_path / "ok.jsonl", [{"a": 1}])
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(
        DataError, match=r"dataset 1 \(loading_params\.datasets\[1\]\.path = .*nope"
    ):
        open_datasets([_cfg(good), _cfg(missing)])
    with pytest.raises(
        DataError, match=r"datasets\[0\]\.path\.test = .*no such file.*fix the path"
    ):
        open_dataset(_cfg({"train": good, "test": missing}))
    with pytest.raises(DataError, match="is a directory, expected a JSONL file"):
        open_dataset(_cfg(str(tmp_path)))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        DataError, match=r"dataset 0 .*empty.*not a dataset saved with save_to_disk"
    ):
        open_dataset(_cfg(str(empty), "loadable"))
    with pytest.raises(DataError, match="is a file, but type loadable needs a directory"):
        open_dataset(_cfg(good, "loadable"))
    with pytest.raises(DataError, match="not a readable Parquet file"):
        open_dataset(_cfg(good, "parquet"))
    with pytest.raises(DataError, match=r"holds no \*\.parquet file"):
        open_dataset(_cfg(str(empty), "parquet"))


def test_importing_the_loader_does_not_import_datasets_or_pyarrow() -> None:
    code = (
        "import sys, mmirage.core.loader; "
        "print(sorted(m for m in ('datasets', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_unreadable_file_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mmirage.core.loader as loader_pkg

    path = _write_jsonl(tmp_path / "locked.jsonl", [{"a": 1}])

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", args[0])

    # chmod does not stop root (the CI user here), so the open() the check makes is refused.
    monkeypatch.setattr(loader_pkg, "open", denied, raising=False)
    with pytest.raises(DataError, match=r"locked\.jsonl.*cannot be read \(Permission denied\)"):
        open_dataset(_cfg(path))
