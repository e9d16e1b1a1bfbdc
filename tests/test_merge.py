"""merge, merge-dir and stats: shards built by the real runner (fake processor), merged in
process and through ``python -m mmirage`` subprocesses; HF output read with load_from_disk."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from mmirage.config import load_mmirage_config
from mmirage.config.models import MMirageConfig
from mmirage.core.merge.shards import (
    IncompleteShardsError,
    human_seconds,
    merge_config,
    merge_dir,
    stats_report,
)
from mmirage.core.process.base import OutputRequest, OutputResult, Processor
from mmirage.core.shard import run_shard
from mmirage.core.writer.formats import infer_schema, write_dataset
from mmirage.rundir import RunDir

ROWS = 7
SHARDS = 3
FAIL_KEY = "0::5"  # this row's output fails: a row with __errors__ and null schema columns


class Echo(Processor):
    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        return [
            OutputResult(error="scripted failure", input_tokens=1)
            if r.row_key == FAIL_KEY
            else OutputResult(value=f"echo:{r.prompt}", input_tokens=2, output_tokens=3)
            for r in requests
        ]

    async def aclose(self) -> None:
        pass


def make_config(tmp_path: Path) -> tuple[MMirageConfig, Path]:
    with open(tmp_path / "in.jsonl", "w") as f:
        for i in range(ROWS):
            f.write(json.dumps({"id": i, "text": f"t{i}"}) + "\n")
    data = {
        "processors": [{"type": "llm", "model": "m", "message_format": "local"}],
        "loading_params": {
            "datasets": [
                {"path": str(tmp_path / "in.jsonl"), "type": "JSONL", "output_dir": "out"}
            ],
            "num_shards": SHARDS,
            "batch_size": 2,
            "state_dir": str(tmp_path / "state"),
            "output_format": "jsonl",  # these tests read the shard files as JSONL lines
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Q {{ text }}"}],
            "output_schema": {
                "conversations": [
                    {"role": "user", "content": "{{ text }}"},
                    {"role": "assistant", "content": "{{ answer }}"},
                ],
            },
        },
    }
    data["loading_params"]["datasets"][0]["output_dir"] = str(tmp_path / "out")  # type: ignore[index]
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return load_mmirage_config(path), path


def run_all(config: MMirageConfig, shards: Sequence[int] = range(SHARDS)) -> None:
    for k in shards:
        run_shard(config, k, processors={"llm": Echo()})


def shard_rows(out: Path) -> list[dict[str, Any]]:
    rows = []
    for k in range(SHARDS):
        rows += [
            json.loads(x) for x in (out / f"shard-{k}-of-{SHARDS}.jsonl").read_text().splitlines()
        ]
    return rows


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def mmirage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def built(tmp_path: Path) -> tuple[MMirageConfig, Path]:
    config, path = make_config(tmp_path)
    run_all(config)
    return config, path


def test_cli_merge_hf_is_the_concatenation_in_order(
    built: tuple[MMirageConfig, Path], tmp_path: Path
) -> None:
    import datasets

    _, path = built
    result = mmirage("merge", str(path))
    assert result.returncode == 0, result.stderr
    assert f"{ROWS} rows (1 failed), tokens {6 * 2 + 1} in / {6 * 3} out" in result.stdout

    expected = shard_rows(tmp_path / "out")
    assert [r["__row_key__"] for r in expected] == [f"0::{i}" for i in range(ROWS)]
    merged = datasets.load_from_disk(str(tmp_path / "out" / "merged"))
    assert isinstance(merged, datasets.Dataset)
    assert merged.column_names == list(expected[0])
    got = merged.to_list()
    assert got[0]["conversations"] == [
        {"role": "user", "content": "t0"},
        {"role": "assistant", "content": "echo:Q t0"},
    ]
    # A failed row keeps the fields that only read inputs; the failed output's is null.
    assert got[5]["conversations"] == [
        {"role": "user", "content": "t5"},
        {"role": "assistant", "content": None},
    ]
    assert got[5]["__errors__"] == {"answer": "scripted failure"}
    assert got[5]["__usage__"] == {"input_tokens": 1, "output_tokens": 0}
    assert got == expected  # exact values, in source order

    again = mmirage("merge", str(path))  # rerun: the old merge is replaced
    assert again.returncode == 0, again.stderr
    assert datasets.load_from_disk(str(tmp_path / "out" / "merged")).num_rows == ROWS


def test_cli_merge_refuses_missing_shards_unless_allowed(tmp_path: Path) -> None:
    config, path = make_config(tmp_path)
    run_all(config, [0, 2])
    refused = mmirage("merge", str(path), "--format", "jsonl")
    assert refused.returncode == 1
    assert "shard id(s) 1" in refused.stderr and "--allow-partial" in refused.stderr
    assert not (tmp_path / "out" / "merged.jsonl").exists()

    partial = mmirage("merge", str(path), "--format", "jsonl", "--allow-partial")
    assert partial.returncode == 0, partial.stderr
    keys = [r["__row_key__"] for r in jsonl(tmp_path / "out" / "merged.jsonl")]
    assert keys == ["0::0", "0::1", "0::2", "0::5", "0::6"]  # shards 0 and 2, in order


def test_cli_merge_config_error_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("loading_params: {num_shards: 0}\n")
    assert mmirage("merge", str(bad)).returncode == 2
    assert mmirage("stats", str(bad)).returncode == 2


def test_merge_jsonl_and_parquet(built: tuple[MMirageConfig, Path], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    config, _ = built
    expected = shard_rows(tmp_path / "out")
    [res] = merge_config(config, RunDir.of(config), fmt="jsonl", output_root=tmp_path / "root")
    assert res.output == str(tmp_path / "root" / "out.jsonl")  # the original's root layout
    assert jsonl(Path(res.output)) == expected
    assert (res.rows, res.rows_failed, res.input_tokens, res.output_tokens) == (7, 1, 13, 18)

    [res] = merge_config(config, RunDir.of(config), fmt="parquet")
    assert res.output == str(tmp_path / "out" / "merged.parquet")
    assert res.rows == ROWS  # counted once, though the Arrow formats read twice
    assert pq.read_table(res.output).to_pylist() == expected


def test_merge_dir_jsonl_shards_and_original_hf_shards(
    built: tuple[MMirageConfig, Path], tmp_path: Path
) -> None:
    import datasets

    expected = shard_rows(tmp_path / "out")
    [res] = merge_dir(tmp_path / "out", tmp_path / "m", fmt="jsonl")
    assert jsonl(tmp_path / "m.jsonl") == expected and res.shards == [0, 1, 2]

    # The original's layout: HF shard_<k>/ directories, one level down.
    orig = tmp_path / "orig" / "ds"
    for k in range(SHARDS):
        rows = jsonl(tmp_path / "out" / f"shard-{k}-of-{SHARDS}.jsonl")
        datasets.Dataset.from_list(rows).save_to_disk(str(orig / f"shard_{k}"))
    cli = mmirage("merge-dir", str(tmp_path / "orig"), "--output", str(tmp_path / "o"))
    assert cli.returncode == 0, cli.stderr
    assert datasets.load_from_disk(str(tmp_path / "o" / "ds")).to_list() == expected

    (tmp_path / "out" / f"shard-1-of-{SHARDS}.jsonl").unlink()
    with pytest.raises(IncompleteShardsError, match=r"shard id\(s\) 1"):
        merge_dir(tmp_path / "out")
    assert mmirage("merge-dir", str(tmp_path / "out")).returncode == 1


def test_merge_dir_of_a_path_without_shards_is_the_users_error_exit_2(tmp_path: Path) -> None:
    """Nothing was attempted: the user must name another path (exit 2, one sentence)."""
    nowhere = mmirage("merge-dir", str(tmp_path / "nowhere"))
    assert nowhere.returncode == 2
    assert nowhere.stderr == f"error: {tmp_path / 'nowhere'} is not a directory\n"
    (tmp_path / "empty").mkdir()
    empty = mmirage("merge-dir", str(tmp_path / "empty"))
    assert empty.returncode == 2 and empty.stderr.startswith("error: no shards in ")
    assert empty.stderr.count("\n") == 1


def test_mixed_types_become_json_text(tmp_path: Path) -> None:
    import datasets

    rows = [{"a": 1, "b": None}, {"a": "x", "b": {"k": 1}}, {"a": None, "b": {"j": 2.5}}]

    def batches() -> Any:
        return iter([[r] for r in rows])  # one row per batch: types differ across batches

    schema = infer_schema(batches())
    assert schema.json_columns == ["a"]
    write_dataset(batches, tmp_path / "hf", "hf")
    got = datasets.load_from_disk(str(tmp_path / "hf")).to_list()
    assert [r["a"] for r in got] == ["1", '"x"', None]
    assert [r["b"] for r in got] == [None, {"k": 1, "j": None}, {"k": None, "j": 2.5}]


def test_cli_stats(built: tuple[MMirageConfig, Path]) -> None:
    config, path = built
    result = mmirage("stats", str(path))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report == json.loads(json.dumps(stats_report(config, RunDir.of(config)), default=str))
    agg = report["aggregate"]
    assert agg["total_shards"] == agg["completed_shards"] == agg["published_shards"] == SHARDS
    assert agg["total_rows_processed"] == agg["total_rows"] == ROWS
    assert agg["total_rows_failed"] == 1
    assert (agg["total_input_tokens"], agg["total_output_tokens"]) == (13, 18)
    assert agg["sum_shard_runtime_seconds"] >= agg["max_shard_runtime_seconds"] >= 0
    shard0 = report["per_shard"][0]
    assert shard0["state"] == "success" and shard0["stats"]["rows_processed"] == 3
    assert shard0["published"][0]["rows_done"] == 3 and shard0["published"][0]["complete"]


def test_human_seconds() -> None:
    assert human_seconds(5.2) == "5.20 seconds"
    assert human_seconds(65.2) == "1 minute and 5.20 seconds"
    assert human_seconds(3725.0) == "1 hour, 2 minutes and 5.00 seconds"
