"""Published shards in ``loading_params.output_format`` (HF save_to_disk, Parquet, JSONL):
converted from the JSONL part file in batches, atomically; finished shards recognised in any
format; merge reads any mix of them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmirage.config import load_mmirage_config_dict
from mmirage.config.errors import ConfigError
from mmirage.core.merge.shards import merge_dir
from mmirage.core.shard import runner
from mmirage.core.shard.output import ShardOutput
from mmirage.core.writer import formats
from mmirage.core.writer.formats import BATCH_ROWS, Format, iter_rows

FP = "fingerprint-1"
FAILED_ROW = BATCH_ROWS + 100  # its __errors__ dict first appears in the second read batch

# The runner builds ShardOutput; until it passes loading_params.output_format, it publishes JSONL.
RUNNER_WIRED = "output_format" in Path(runner.__file__).read_text()


def make_rows(n: int, start: int = 0) -> list[dict[str, Any]]:
    rows = []
    for i in range(start, start + n):
        failed = i == FAILED_ROW
        rows.append(
            {
                "id": i,
                "answer": None if failed else f"a{i}",
                "meta": {"n": i, "tags": ["x", str(i)]},
                "__row_key__": f"0::{i}",
                "__errors__": {"answer": "boom"} if failed else None,
                "__usage__": {"input_tokens": 2, "output_tokens": 0 if failed else 3},
            }
        )
    return rows


def publish(out_dir: Path, fmt: Format, rows: list[dict[str, Any]], shard: int = 0) -> ShardOutput:
    out = ShardOutput(str(out_dir), shard, 3, fmt)
    ckpt = out.open(FP)
    out.append(rows)
    ckpt.rows_done = len(rows)
    ckpt.rows_failed = sum(r["__errors__"] is not None for r in rows)
    ckpt.input_tokens = sum(r["__usage__"]["input_tokens"] for r in rows)
    ckpt.output_tokens = sum(r["__usage__"]["output_tokens"] for r in rows)
    out.publish(ckpt)
    return out


def read_all(path: Path) -> list[dict[str, Any]]:
    return [row for batch in iter_rows(path) for row in batch]


@pytest.mark.parametrize("fmt", ["hf", "parquet", "jsonl"])
def test_publish_writes_the_format_from_the_part_file(tmp_path: Path, fmt: Format) -> None:
    rows = make_rows(BATCH_ROWS * 2 + 50)  # several conversion batches
    out = publish(tmp_path, fmt, rows)

    dest = out.path_for(fmt)
    assert out.published == dest
    assert dest.is_dir() if fmt == "hf" else dest.is_file()
    if fmt == "hf":
        import datasets

        loaded = datasets.load_from_disk(str(dest))
        assert isinstance(loaded, datasets.Dataset) and loaded.num_rows == len(rows)
        assert loaded[0]["meta"] == {"n": 0, "tags": ["x", "0"]}
        assert loaded[FAILED_ROW]["__errors__"] == {"answer": "boom"}
        assert loaded[1]["__errors__"] is None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        assert pq.read_table(dest).num_rows == len(rows)
    assert read_all(dest) == rows
    # Nothing left behind: no part file, no temporary sibling.
    assert not out.part.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([".parts", dest.name])


@pytest.mark.parametrize("fmt", ["hf", "parquet", "jsonl"])
def test_finished_counts_the_published_rows_when_the_checkpoint_is_lost(
    tmp_path: Path, fmt: Format
) -> None:
    rows = make_rows(BATCH_ROWS + 200)
    out = publish(tmp_path, fmt, rows)
    out.checkpoint_path.unlink()
    ckpt = out.finished()
    assert ckpt is not None and ckpt.complete
    assert (ckpt.rows_done, ckpt.rows_failed) == (len(rows), 1)
    assert (ckpt.input_tokens, ckpt.output_tokens) == (2 * len(rows), 3 * (len(rows) - 1))


@pytest.mark.parametrize("fmt", ["hf", "parquet"])
def test_an_empty_shard_is_published(tmp_path: Path, fmt: Format) -> None:
    out = publish(tmp_path, fmt, [])
    assert out.find_published() == out.path_for(fmt)
    assert read_all(out.published) == []
    finished = out.finished()
    assert finished is not None and finished.rows_done == 0


def test_a_shard_published_in_another_format_still_counts_as_finished(tmp_path: Path) -> None:
    publish(tmp_path, "parquet", make_rows(5))
    now_hf = ShardOutput(str(tmp_path), 0, 3, "hf")
    finished = now_hf.finished()
    assert finished is not None and finished.rows_done == 5  # never recomputed nor re-billed
    assert now_hf.published == tmp_path / "shard-0-of-3.parquet"
    now_hf.begin_recompute()  # still readable, no longer finished
    assert now_hf.find_published() == tmp_path / "shard-0-of-3.parquet"
    assert now_hf.finished() is None and not now_hf.checkpoint_path.exists()
    rows = make_rows(3)
    ckpt = now_hf.open(FP)
    now_hf.append(rows)
    ckpt.rows_done = len(rows)
    now_hf.publish(ckpt)
    assert now_hf.find_published() == now_hf.path_for("hf")  # the parquet one is gone
    assert not (tmp_path / "shard-0-of-3.parquet").exists()
    finished = now_hf.finished()
    assert finished is not None and finished.rows_done == 3 and not now_hf.recomputing


def test_a_failed_conversion_publishes_nothing_and_keeps_the_part_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = formats.to_arrow
    calls = [0]

    def dies_on_second_batch(batch: list[dict[str, Any]], schema: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            raise OSError("disk gone")
        return real(batch, schema)

    monkeypatch.setattr(formats, "to_arrow", dies_on_second_batch)
    rows = make_rows(BATCH_ROWS * 2)
    with pytest.raises(OSError, match="disk gone"):
        publish(tmp_path, "parquet", rows)
    out = ShardOutput(str(tmp_path), 0, 3, "parquet")
    assert out.find_published() is None and out.finished() is None
    assert [p.name for p in tmp_path.iterdir()] == [".parts"]  # no temporary file either
    resume = out.resume_point(FP)  # a rerun resumes with every row: nothing to pay again
    assert resume.rows_done == len(rows) and not resume.complete

    monkeypatch.setattr(formats, "to_arrow", real)
    ckpt = out.open(FP)
    out.publish(ckpt)
    assert read_all(out.published) == rows


def test_merge_reads_shards_of_every_format(tmp_path: Path) -> None:
    rows = make_rows(9)
    every: tuple[Format, ...] = ("hf", "parquet", "jsonl")
    for shard, fmt in enumerate(every):
        publish(tmp_path / "out", fmt, rows[shard * 3 : shard * 3 + 3], shard=shard)
    [result] = merge_dir(tmp_path / "out", tmp_path / "merged", "jsonl")
    assert result.shards == [0, 1, 2] and result.rows == 9
    merged = [json.loads(line) for line in Path(result.output).read_text().splitlines()]
    assert merged == rows


def base_config(tmp_path: Path, **loading: Any) -> dict[str, Any]:
    return {
        "processors": [{"type": "custom", "script_path": "fn.py", "function_name": "f"}],
        "loading_params": {
            "datasets": [{"type": "JSONL", "path": "in.jsonl", "output_dir": str(tmp_path)}],
            **loading,
        },
        "processing_params": {
            "inputs": [],
            "outputs": [{"name": "o", "type": "custom"}],
            "output_schema": {"o": "{{ o }}"},
        },
    }


def test_output_format_field(tmp_path: Path) -> None:
    default = load_mmirage_config_dict(base_config(tmp_path), source="t.yaml", env={})
    assert default.loading_params.output_format == "hf"  # the original's format
    upper = load_mmirage_config_dict(
        base_config(tmp_path, output_format="Parquet"), source="t.yaml", env={}
    )
    assert upper.loading_params.output_format == "parquet"
    with pytest.raises(ConfigError, match=r"loading_params\.output_format: must be 'hf', 'jsonl'"):
        load_mmirage_config_dict(base_config(tmp_path, output_format="csv"), source="t.yaml")


# -- end to end through the CLI ---------------------------------------------------------------


def mmirage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args], capture_output=True, text=True, timeout=180
    )


def cli_config(tmp_path: Path, fmt: str) -> Path:
    with open(tmp_path / "in.jsonl", "w") as f:
        for i in range(7):
            f.write(json.dumps({"id": i, "text": f"t{i}"}) + "\n")
    (tmp_path / "fn.py").write_text("def shout(variables):\n    return variables['text'].upper()\n")
    config = {
        "processors": [
            {"type": "custom", "script_path": str(tmp_path / "fn.py"), "function_name": "shout"}
        ],
        "loading_params": {
            "datasets": [
                {"path": str(tmp_path / "in.jsonl"), "type": "JSONL", "output_dir": "out"}
            ],
            "num_shards": 2,
            "batch_size": 3,
            "state_dir": str(tmp_path / "state"),
            "output_format": fmt,
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "loud", "type": "custom"}],
            "output_schema": {"loud": "{{ loud }}"},
        },
    }
    config["loading_params"]["datasets"][0]["output_dir"] = str(tmp_path / "out")  # type: ignore[index]
    path = tmp_path / "pipeline.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


@pytest.mark.skipif(not RUNNER_WIRED, reason="runner.py does not pass output_format yet")
@pytest.mark.parametrize("fmt", ["hf", "parquet"])
def test_cli_run_publishes_the_configured_format_and_merge_reads_it(
    tmp_path: Path, fmt: str
) -> None:
    config = cli_config(tmp_path, fmt)
    ran = mmirage("run", str(config))
    assert ran.returncode == 0, ran.stderr
    names = {"hf": ["shard-0-of-2", "shard-1-of-2"], "parquet": ["shard-0-of-2.parquet"]}
    for name in names[fmt]:
        assert (tmp_path / "out" / name).exists()
    assert not list((tmp_path / "out").glob("*.jsonl"))
    if fmt == "hf":
        import datasets

        shard = datasets.load_from_disk(str(tmp_path / "out" / "shard-0-of-2"))
        assert shard["loud"] == ["T0", "T1", "T2", "T3"]

    again = mmirage("run", str(config))  # finished shards are recognised: nothing recomputed
    assert again.returncode == 0 and again.stderr.count("already done") == 2

    merged = mmirage("merge", str(config), "--format", "jsonl")
    assert merged.returncode == 0, merged.stderr
    rows = [json.loads(x) for x in (tmp_path / "out" / "merged.jsonl").read_text().splitlines()]
    assert [r["loud"] for r in rows] == [f"T{i}" for i in range(7)]


def _counted(rows: list[dict[str, Any]], reads: list[int]) -> formats.Batches:
    """Batches of 1000 rows that count how often the rows are read from the start."""

    def batches() -> Iterator[list[dict[str, Any]]]:
        reads.append(1)
        for start in range(0, len(rows), formats.BATCH_ROWS):
            yield rows[start : start + formats.BATCH_ROWS]

    return batches


@pytest.mark.parametrize("fmt", ["hf", "parquet"])
@pytest.mark.parametrize("late", [None, "a float", "a new column", "a failed row"], ids=str)
def test_arrow_formats_read_a_uniform_shard_once_and_others_twice(
    tmp_path: Path, fmt: Format, late: str | None
) -> None:
    """What a later batch changes (ints then a float, a new column, a first error) is in the
    written schema as if it had been seen first: the rows are then read twice."""
    rows: list[dict[str, Any]] = [{"n": i, "t": f"r{i}", "__errors__": None} for i in range(2500)]
    if late == "a float":
        rows[2100]["n"] = 0.5
    elif late == "a new column":
        rows[1500]["extra"] = "x"
    elif late == "a failed row":
        rows[2200]["__errors__"] = {"answer": "boom"}
    reads: list[int] = []
    dest = tmp_path / f"out{formats.SUFFIX[fmt]}"
    schema = formats.write_dataset(_counted(rows, reads), dest, fmt)
    assert schema is not None
    assert schema.arrow == formats.infer_schema([rows]).arrow
    assert len(reads) == (1 if late is None else 3)  # the try that stopped, then two passes
    assert read_all(dest) == [{name: r.get(name) for name in schema.arrow.names} for r in rows]
