"""A full disk under the output_dir or the state_dir: the run fails (exit 1) with one sentence
naming the file and what to do, and once there is room again the shard resumes and publishes
every row. Real 2 MiB tmpfs mounts (root only; skipped where mounting is not permitted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROWS = 60
FUNCTION = """
def big(variables):
    return variables["text"] * 20000
"""


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def config(tmp_path: Path, out: Path, state: Path) -> Path:
    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"text": f"r{i:03d}"}) + "\n" for i in range(ROWS)))
    (tmp_path / "fn.py").write_text(FUNCTION)
    data = {
        "processors": [
            {"type": "custom", "script_path": str(tmp_path / "fn.py"), "function_name": "big"}
        ],
        "loading_params": {
            "datasets": [{"path": str(rows), "type": "JSONL", "output_dir": str(out)}],
            "state_dir": str(state),
            "batch_size": 5,
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "long", "type": "custom"}],
            "output_schema": {"text": "{{ text }}", "long": "{{ long }}"},
        },
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(json.dumps(data))
    return path


def mmirage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ),
    )


def test_a_full_output_dir_names_the_file_then_resumes(tmp_path: Path, small_disk: Path) -> None:
    path = config(tmp_path, small_disk / "out", tmp_path / "state")
    full = mmirage("run", str(path))  # ~4.8 MB of rows on a 2 MiB disk
    assert full.returncode == 1, full.stderr
    said = [line for line in full.stderr.splitlines() if "no space left" in line]
    assert said and str(small_disk / "out") in said[0], full.stderr
    assert "free space on that disk, or choose another" in said[0]
    assert "output_dir" in said[0] and "Traceback" not in full.stderr
    kept = json.loads((small_disk / "out" / ".parts" / "shard-0-of-1.ckpt.json").read_text())
    assert 0 < kept["rows_done"] < ROWS  # what was checkpointed before the disk filled up

    subprocess.run(["mount", "-o", "remount,size=16m", str(small_disk)], check=True)
    again = mmirage("run", str(path))
    assert again.returncode == 0, again.stderr
    assert f"resumed after {kept['rows_done']}" in again.stderr
    lines = (small_disk / "out" / "shard-0-of-1.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert [r["text"] for r in rows] == [f"r{i:03d}" for i in range(ROWS)]
    assert all(r["long"] == r["text"] * 20000 and not r["__errors__"] for r in rows)


def test_a_full_state_dir_names_status_json(tmp_path: Path, small_disk: Path) -> None:
    path = config(tmp_path, tmp_path / "out", small_disk / "state")
    filler = small_disk / "filler"
    with open(filler, "wb") as f:  # leave the state dir no room at all
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    full = mmirage("run", str(path))
    assert full.returncode == 1, full.stderr
    said = [line for line in full.stderr.splitlines() if "no space left" in line]
    assert said and "status.json" in said[0] and "state_dir" in said[0], full.stderr
    assert "Traceback" not in full.stderr

    filler.unlink()
    again = mmirage("run", str(path))
    assert again.returncode == 0, again.stderr
    assert len((tmp_path / "out" / "shard-0-of-1.jsonl").read_text().splitlines()) == ROWS
