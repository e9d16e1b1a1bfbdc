"""CSV and TSV inputs: a header row, every value as text, stable row ids for any shard layout,
and malformed records reported as one sentence naming the file and line (or published as that
row's error with ``on_bad_row: skip``), in the reader and through the real ``mmirage`` CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmirage.config import load_mmirage_config_dict
from mmirage.config.errors import ConfigError
from mmirage.config.loading_params import DatasetConfig
from mmirage.core.loader import BadRow, DataError, open_dataset, shard_range
from mmirage.core.loader.delimited import DelimitedReader

MMIRAGE = Path(sys.executable).with_name("mmirage")

# BOM, blank lines, a quoted comma, a quoted newline, an empty value, a number-looking value,
# CRLF line ends and no final newline.
GOOD_CSV = (
    b'\xef\xbb\xbfid,text,score\r\n1,hello,0.5\r\n\r\n2,"a, b",007\n3,"two\nlines",\n\n4,last,1e3'
)
GOOD_ROWS = [
    {"id": "1", "text": "hello", "score": "0.5"},
    {"id": "2", "text": "a, b", "score": "007"},
    {"id": "3", "text": "two\nlines", "score": ""},
    {"id": "4", "text": "last", "score": "1e3"},
]


def _cfg(path: str | dict[str, str], type_: str = "CSV") -> DatasetConfig:
    return DatasetConfig(path=path, type=type_, output_dir="out")  # type: ignore[arg-type]


def test_rows_are_text_keyed_by_the_header(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(GOOD_CSV)
    source = open_dataset(_cfg(str(path)))
    assert source.num_rows == 4  # blank lines take no row id
    rows = list(source.iter_rows())
    assert [r.data for r in rows] == GOOD_ROWS
    assert [r.row_id for r in rows] == [0, 1, 2, 3]


def test_tsv_and_a_split_mapping(tmp_path: Path) -> None:
    train, test = tmp_path / "train.tsv", tmp_path / "test.tsv"
    train.write_text("id\ttext\n1\tcomma, kept\n2\tb\n", encoding="utf-8")
    test.write_text("id\ttext\n9\tz\n", encoding="utf-8")
    source = open_dataset(_cfg({"train": str(train), "test": str(test)}, "TSV"))
    assert source.splits == ["train", "test"]
    assert [(r.split, r.row_id, r.data) for r in source.iter_rows(split="train")] == [
        ("train", 0, {"id": "1", "text": "comma, kept"}),
        ("train", 1, {"id": "2", "text": "b"}),
    ]
    assert [r.data["id"] for r in source.iter_rows(split="test")] == ["9"]


def test_shards_cover_every_row_once_for_any_layout_and_block_size(tmp_path: Path) -> None:
    lines = ["id,text"]
    for i in range(83):
        text = f'"row {i}\nspans, lines"' if i % 7 == 0 else f"row {i}"
        lines.append(f"{i},{text}")
        if i % 11 == 4:
            lines.append("")
        if i % 19 == 3:
            lines.append("x,y,z")  # malformed: takes its id, skipped here
    path = tmp_path / "d.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    for block_size in (1, 50, 1 << 20):  # checkpoints at every record, some, or none
        reader = DelimitedReader(str(path), block_size=block_size)
        whole = list(reader.iter_rows(on_bad_row="skip"))
        assert len(whole) == 83 and reader.num_rows == 83 + 5
        assert [r.data["id"] for r in whole] == [str(i) for i in range(83)]
        for num_shards in (1, 2, 5, 88, 100):
            parts = [
                list(
                    reader.iter_rows(
                        *shard_range(reader.num_rows, num_shards, k), on_bad_row="skip"
                    )
                )
                for k in range(num_shards)
            ]
            assert [r for part in parts for r in part] == whole


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        (b"3,three", "has 2 fields, the header has 3"),
        (b"3,three,x,extra", "has 4 fields, the header has 3"),
        (b'3,"three"x,y', "not a valid record"),
        (b"3,thr\xffee,x", "not UTF-8 text"),
    ],
)
def test_a_malformed_record_names_file_and_line(
    tmp_path: Path, record: bytes, problem: str
) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(b"id,text,score\n1,one,1\n\n2,two,2\n" + record + b"\n4,four,4\n")
    source = open_dataset(_cfg(str(path)))
    with pytest.raises(DataError) as failed:
        list(source.iter_rows())
    message = str(failed.value)
    assert message.startswith(f"{path}, line 5: {problem}")
    assert "on_bad_row: skip" in message and "\n" not in message
    skipped: list[BadRow] = []
    rows = list(source.iter_rows(on_bad_row="skip", bad_rows=skipped.append))
    assert [r.row_id for r in rows] == [0, 1, 3]  # the bad record keeps its id
    assert [(b.file, b.line, b.row_id) for b in skipped] == [(str(path), 5, 2)]
    assert skipped[0].error.startswith(problem)


def test_an_unclosed_quote_is_reported_at_the_line_it_opens(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text('id,text\n1,one\n2,"never closed\n3,three\n', encoding="utf-8")
    skipped: list[BadRow] = []
    rows = list(open_dataset(_cfg(str(path))).iter_rows(on_bad_row="skip", bad_rows=skipped.append))
    assert [r.data["id"] for r in rows] == ["1"]
    assert [(b.line, b.row_id) for b in skipped] == [(3, 1)]
    assert "not a valid record" in skipped[0].error


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "the file is empty; a CSV dataset needs a header row"),
        (b"\n\n", "the file is empty"),
        (
            b"id,text,id\n1,a,b\n",
            "line 1 (the header): the column name 'id' appears more than once",
        ),
        (b"id,,text\n1,a,b\n", "line 1 (the header): a column has no name"),
        (b'id,"te"xt\n', "line 1 (the header): not a valid record"),
    ],
)
def test_a_bad_header_is_one_sentence(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "d.csv"
    path.write_bytes(content)
    with pytest.raises(DataError) as failed:
        open_dataset(_cfg(str(path))).num_rows  # noqa: B018
    assert str(failed.value).startswith(f"{path}")
    assert fragment in str(failed.value) and "\n" not in str(failed.value)


def test_a_directory_or_missing_file_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(
        DataError, match=r"datasets\[0\]\.path.*is a directory, expected a CSV file"
    ):
        open_dataset(_cfg(str(tmp_path)))
    with pytest.raises(DataError, match="no such file or directory"):
        open_dataset(_cfg(str(tmp_path / "nope.csv")))


def test_the_type_is_read_in_any_case_and_hub_options_are_refused() -> None:
    for spelling, stored in (("csv", "CSV"), ("Tsv", "TSV")):
        config = load_mmirage_config_dict(_pipeline("d.csv", type=spelling))
        assert config.loading_params.datasets[0].type == stored
    with pytest.raises(ConfigError, match="streaming: is an option of type hub, not CSV"):
        load_mmirage_config_dict(_pipeline("d.csv", streaming=True))


# -- through the CLI -----------------------------------------------------------------------------

SCRIPT = "def upper(variables):\n    return variables['text'].upper()\n"


def _pipeline(data: str, **dataset: Any) -> dict[str, Any]:
    return {
        "processors": [{"type": "custom", "script_path": "script.py", "function_name": "upper"}],
        "loading_params": {
            "state_dir": "state",
            "datasets": [{"path": data, "type": "csv", "output_dir": "out", **dataset}],
            "num_shards": 2,
            "batch_size": 2,
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}, {"name": "text", "key": "text"}],
            "outputs": [{"name": "loud", "type": "custom"}],
            "output_schema": {"id": "{{ id }}", "loud": "{{ loud }}"},
        },
    }


def _mmirage(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [str(MMIRAGE)] if MMIRAGE.exists() else [sys.executable, "-m", "mmirage"]
    env = {**os.environ, "XDG_CACHE_HOME": str(cwd / "cache")}
    return subprocess.run(
        [*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def _published(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for k in range(2):
        rows += [
            json.loads(line) for line in (out / f"shard-{k}-of-2.jsonl").read_text().splitlines()
        ]
    return rows


def test_run_publishes_every_row_and_the_bad_one_with_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "d.csv").write_text(
        'id,text\n1,alpha\n2,"be\nta"\n3,gamma,extra\n4,delta\n5,epsilon\n', encoding="utf-8"
    )
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(_pipeline("d.csv")))
    done = _mmirage("run", "pipeline.yaml", cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode in (0, 1), done.stderr
    rows = _published(tmp_path / "out")
    assert [r["loud"] for r in rows] == ["ALPHA", "BE\nTA", None, "DELTA", "EPSILON"]
    bad = " ".join(str(v) for v in rows[2]["__errors__"].values())
    assert "d.csv" in bad and "line 5" in bad and "has 3 fields, the header has 2" in bad
    assert [r["__errors__"] for i, r in enumerate(rows) if i != 2] == [None] * 4
    # Resume: a second run finds both shards done and publishes the same rows.
    again = _mmirage("run", "pipeline.yaml", cwd=tmp_path)
    assert again.returncode in (0, 1), again.stderr
    assert _published(tmp_path / "out") == rows


def test_run_with_on_bad_row_fail_stops_with_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    (tmp_path / "d.csv").write_text("id,text\n1,alpha\n2\n", encoding="utf-8")
    config = _pipeline("d.csv")
    config["loading_params"]["on_bad_row"] = "fail"
    config["loading_params"]["num_shards"] = 1
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    done = _mmirage("run", "pipeline.yaml", cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert "d.csv, line 3: has 1 fields, the header has 2" in errors[0]
    assert done.returncode == 2
