"""The Arrow helper process: a shard's HF or Parquet publish written beside the run, the same
bytes as in the run's own process, and never a cause of failure (anything but success and the
run converts by itself, raising what it raises)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from mmirage.config import load_mmirage_config_dict
from mmirage.core.process.base import OutputResult, Processor
from mmirage.core.shard import landing, runner
from mmirage.core.shard.output import ShardOutput
from mmirage.core.writer import helper as helper_module
from mmirage.core.writer.formats import Format, FormatError, iter_rows
from mmirage.core.writer.helper import ArrowHelper

FP = "fp"


def rows(n: int) -> list[dict[str, Any]]:
    return [
        {"id": i, "answer": f"a{i}", "meta": {"tags": ["x", str(i)]}, "__row_key__": f"0::{i}"}
        for i in range(n)
    ]


def published_bytes(path: Path) -> dict[str, Any]:
    """The published files' bytes; HF's state.json without its fingerprint, new at every
    write as datasets' own."""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    found: dict[str, Any] = {f.name: f.read_bytes() for f in files}
    if "state.json" in found:
        found["state.json"] = {**json.loads(found["state.json"]), "_fingerprint": None}
    return found


def publish(out_dir: Path, fmt: Format, written: list[dict[str, Any]], arrow: ArrowHelper) -> Path:
    out = ShardOutput(str(out_dir), 0, 1, fmt)
    out.arrow = arrow
    ckpt = out.open(FP)
    out.append(written)
    ckpt.rows_done = len(written)
    out.publish(ckpt)
    return out.path_for(fmt)


def leftovers(out_dir: Path) -> list[str]:
    return sorted(p.name for p in out_dir.iterdir() if ".tmp." in p.name)


@pytest.mark.parametrize("fmt", ["hf", "parquet"])
def test_the_helper_writes_what_the_run_would_write_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: Format
) -> None:
    data = rows(2500)  # several conversion batches
    in_process = publish(tmp_path / "here", fmt, data, ArrowHelper())
    not_in_this_process(monkeypatch)
    with ArrowHelper.start(fmt) as arrow:
        by_helper = publish(tmp_path / "helper", fmt, data, arrow)

    assert published_bytes(by_helper) == published_bytes(in_process)
    assert [r for batch in iter_rows(by_helper) for r in batch] == data
    assert leftovers(tmp_path / "helper") == []


def test_a_dead_helper_leaves_the_publish_to_the_run(tmp_path: Path) -> None:
    arrow = ArrowHelper.start("hf")
    assert arrow.pid is not None
    os.kill(arrow.pid, signal.SIGKILL)
    dest = publish(tmp_path, "hf", rows(10), arrow)

    assert [r for batch in iter_rows(dest) for r in batch] == rows(10)
    assert not arrow.running  # asked once, found dead, not asked again


def test_a_failed_conversion_is_raised_by_the_run_as_it_would_be_without_a_helper(
    tmp_path: Path,
) -> None:
    part = tmp_path / "part.jsonl"
    part.write_bytes(b'{"id": 1}\nnot json\n')
    with ArrowHelper.start("parquet") as arrow:
        with pytest.raises(FormatError, match=r"line 2 of .*part\.jsonl is not valid JSON"):
            arrow.write(part, tmp_path / "out.parquet", "parquet")
        assert arrow.running  # the helper stays for the next shard
        good = tmp_path / "good.jsonl"
        good.write_bytes(b'{"id": 1}\n')
        arrow.write(good, tmp_path / "good.parquet", "parquet")
    assert [r for batch in iter_rows(tmp_path / "good.parquet") for r in batch] == [{"id": 1}]
    assert not (tmp_path / "out.parquet").exists() and leftovers(tmp_path) == []


def test_ctrl_c_is_left_to_the_run_and_close_ends_the_helper(tmp_path: Path) -> None:
    arrow = ArrowHelper.start("hf")
    assert arrow.pid is not None
    # A terminal's Ctrl-C goes to its foreground process group: the run's, not the helper's.
    assert os.getpgid(arrow.pid) != os.getpgid(0)
    publish(tmp_path, "hf", rows(3), arrow)
    assert arrow.running
    pid = arrow.pid
    arrow.close()
    assert not arrow.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # gone, and reaped


def test_a_helper_stopped_mid_conversion_leaves_no_temporary_file(tmp_path: Path) -> None:
    part = tmp_path / "part.jsonl"
    part.write_bytes(b'{"id": 1}\n' * 5000)
    arrow = ArrowHelper.start("hf")
    assert arrow.grow(part, tmp_path / "out", "hf", part.stat().st_size)  # durable, not final
    deadline = time.monotonic() + 60
    while not leftovers(tmp_path) and time.monotonic() < deadline:  # it has begun writing
        time.sleep(0.01)
    assert leftovers(tmp_path), "the helper never began writing"
    arrow.close()  # the run stopped: its input closes, the conversion unwinds and cleans up
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "out").exists()


def lines_of(written: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(row).encode() + b"\n" for row in written]


@pytest.mark.parametrize(
    "later",
    [
        pytest.param({"score": 1.5}, id="an int column becomes float"),
        pytest.param({"extra": "x"}, id="a new column"),
        pytest.param({}, id="uniform"),
    ],
)
def test_a_part_file_converted_as_it_grows_is_what_a_whole_conversion_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, later: dict[str, Any]
) -> None:
    first = [{"id": i, "score": i, "text": f"t{i}"} for i in range(1500)]
    second = [{"id": i, "score": i, "text": f"t{i}", **later} for i in range(1500, 2600)]
    part = tmp_path / "part.jsonl"
    with ArrowHelper.start("hf") as arrow, monkeypatch.context() as patched:
        not_in_this_process(patched)
        with open(part, "wb") as f:
            for chunk in (lines_of(first), lines_of(second[:300]), lines_of(second[300:])):
                f.writelines(chunk)
                f.flush()
                assert arrow.grow(part, tmp_path / "grown", "hf", f.tell())
        arrow.write(part, tmp_path / "grown", "hf", part.stat().st_size)
    ArrowHelper().write(part, tmp_path / "whole", "hf")

    assert published_bytes(tmp_path / "grown") == published_bytes(tmp_path / "whole")
    assert leftovers(tmp_path) == []


def test_a_part_file_that_shrank_is_converted_whole(tmp_path: Path) -> None:
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(lines_of(rows(50))))
    with ArrowHelper.start("parquet") as arrow:
        arrow.grow(part, tmp_path / "out.parquet", "parquet", part.stat().st_size)
        part.write_bytes(b"".join(lines_of(rows(20))))  # rewritten from the start
        arrow.write(part, tmp_path / "out.parquet", "parquet", part.stat().st_size)
        assert arrow.running
    assert [r for batch in iter_rows(tmp_path / "out.parquet") for r in batch] == rows(20)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()  # ended, waiting for init to reap it
    except FileNotFoundError:
        return True


def test_the_helper_ends_when_its_run_is_killed() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, signal\n"
            "from mmirage.core.writer.helper import ArrowHelper\n"
            "print(ArrowHelper.start('hf').pid, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n",
        ],
        capture_output=True,
        text=True,
    )
    pid = int(run.stdout)
    deadline = time.monotonic() + 30
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(pid)


def not_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the run's own conversion fail: what is written then was written by the helper."""

    def refuse(*args: object) -> None:
        raise AssertionError("converted in the run's process, not by the helper")

    monkeypatch.setattr(helper_module, "write_dataset", refuse)


def test_rows_too_large_for_one_data_file_are_laid_out_by_datasets_in_the_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Rows of ~100 kB: datasets would split its record batches, so it writes the directory.
    big = [{"id": i, "text": "x" * 100_000, "__row_key__": f"0::{i}"} for i in range(40)]
    in_process = publish(tmp_path / "here", "hf", big, ArrowHelper())
    not_in_this_process(monkeypatch)
    with ArrowHelper.start("hf") as arrow:
        by_helper = publish(tmp_path / "helper", "hf", big, arrow)
    assert published_bytes(by_helper) == published_bytes(in_process)


def test_the_helper_loads_pyarrow_without_numpy_and_numpy_stays_importable() -> None:
    check = (
        "import sys\n"
        "from mmirage.core.writer.helper_process import preload\n"
        "preload(['pyarrow'])\n"
        "assert 'pyarrow' in sys.modules and 'numpy' not in sys.modules\n"
        "import numpy\n"
        "print(numpy.arange(3).sum())\n"
    )
    run = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "3"


def test_what_a_killed_publish_left_goes_when_the_shard_opens_again(tmp_path: Path) -> None:
    out = ShardOutput(str(tmp_path), 0, 1, "hf")
    (tmp_path / ".shard-0-of-1.tmp.4242").mkdir()  # a helper killed mid-write
    (tmp_path / ".shard-0-of-1.tmp.4242.arrow").write_bytes(b"half a stream")
    (tmp_path / ".shard-0-of-1.parquet.tmp.77").write_bytes(b"half a file")
    (tmp_path / ".shard-0-of-10.tmp.4242").mkdir()  # another shard's: not this one's to remove
    out.open(FP)
    out.close()
    assert leftovers(tmp_path) == [".shard-0-of-10.tmp.4242"]


def test_a_helper_that_says_something_else_than_an_answer_leaves_the_publish_to_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("print('hello from a library')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    arrow = ArrowHelper.start("hf")
    dest = publish(tmp_path / "out", "hf", rows(10), arrow)

    assert [r for batch in iter_rows(dest) for r in batch] == rows(10)
    assert not arrow.running  # not asked again: its answers cannot be trusted


def test_jsonl_shards_need_no_helper() -> None:
    assert not ArrowHelper.start("jsonl").running


class Echo(Processor):
    async def process(self, output: Any, requests: Sequence[Any]) -> list[OutputResult]:
        return [OutputResult(value=r.prompt) for r in requests]


def hf_config(tmp_path: Path, rows: int = 20, batch_size: int = 1000) -> Any:
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"text": "row {i}"}}\n' for i in range(rows)))
    return load_mmirage_config_dict(
        {
            "processors": [{"type": "llm", "model": "m"}],
            "loading_params": {
                "state_dir": str(tmp_path / "state"),
                "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(tmp_path)}],
                "output_format": "hf",
                "batch_size": batch_size,
            },
            "processing_params": {
                "inputs": [{"name": "text", "key": "text"}],
                "outputs": [{"name": "answer", "type": "llm", "prompt": "{{ text }}"}],
                "output_schema": {"answer": "{{ answer }}"},
            },
        },
        env={},
    )


def test_a_run_hands_its_arrow_publish_to_its_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = hf_config(tmp_path)
    asked: list[tuple[bool, str, int | None]] = []
    real_ask = ArrowHelper._ask

    def ask(self: ArrowHelper, part: Path, dest: Path, fmt: Format, upto: int | None) -> bool:
        asked.append((self.running, fmt, upto))
        return real_ask(self, part, dest, fmt, upto)

    monkeypatch.setattr(ArrowHelper, "_ask", ask)
    report = runner.run_shard(config, 0, processors={"llm": Echo()})

    # Told of each checkpoint, the helper was asked for the rows after the last one only.
    [(running, fmt, upto)] = asked
    assert running and fmt == "hf" and upto is not None and upto > 0
    assert [r["answer"] for batch in iter_rows(Path(report.published[0])) for r in batch] == [
        f"row {i}" for i in range(20)
    ]


def test_the_helper_converts_each_group_as_it_lands_not_at_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five groups and no checkpoint due after the first: the helper still hears of every
    group's rows as they land, so that the publish waits for none of them."""
    monkeypatch.setattr(landing, "CHECKPOINT_SECONDS", 3600.0)
    config = hf_config(tmp_path, rows=20, batch_size=4)
    told: list[tuple[str, int | None]] = []
    real_grow, real_ask = ArrowHelper.grow, ArrowHelper._ask

    def grow(self: ArrowHelper, part: Path, dest: Path, fmt: Format, upto: int) -> bool:
        told.append(("grow", upto))
        return real_grow(self, part, dest, fmt, upto)

    def ask(self: ArrowHelper, part: Path, dest: Path, fmt: Format, upto: int | None) -> bool:
        told.append(("write", upto))
        return real_ask(self, part, dest, fmt, upto)

    monkeypatch.setattr(ArrowHelper, "grow", grow)
    monkeypatch.setattr(ArrowHelper, "_ask", ask)
    report = runner.run_shard(config, 0, processors={"llm": Echo()})

    *grown, (last, end) = told
    assert last == "write" and end is not None
    lengths = [upto for _, upto in grown]
    assert len(set(lengths)) == 5 and lengths == sorted(lengths) and lengths[-1] == end
    assert [r["answer"] for batch in iter_rows(Path(report.published[0])) for r in batch] == [
        f"row {i}" for i in range(20)
    ]
