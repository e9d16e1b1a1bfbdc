"""`mmirage retry`, and `run`/`check`/`stats` fixes, through the real CLI (subprocesses):

* retry reruns failed, dead ("stale") and never-run shards, each with exactly max_retries
  retries in all (status.json ``attempts``), and skips succeeded ones;
* a shard held by another process does not stop the others, and is reported at the end (exit 1);
* a directory that cannot be written exits 2 with one sentence naming the field;
* counters stay consistent through a kill -9 / SIGTERM / resume sequence (no negative rows);
* check prints a per-shard table and exits 0 only when every shard succeeded.

Shards run the real custom processor; ``ROW_DELAY`` (seconds per row, read by the function)
stretches a run so it can be killed mid-way. A shard is made to fail for real by putting a
directory where its published file must go: the publish rename fails on every attempt.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROWS = 12
FUNCTION = """
import os
import time


def shout(variables):
    time.sleep(float(os.environ.get("ROW_DELAY") or 0))
    return variables["text"].upper()
"""


def mmirage(*args: str, delay: float = 0.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROW_DELAY": str(delay)}
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )


def start(*args: str, delay: float, **popen: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "ROW_DELAY": str(delay)}
    return subprocess.Popen(
        [sys.executable, "-m", "mmirage", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **popen,
    )


def cli_config(
    tmp_path: Path,
    *,
    num_shards: int = 2,
    batch_size: int = 1,
    rows: int = ROWS,
    execution: dict[str, Any] | None = None,
    **loading: Any,
) -> Path:
    with open(tmp_path / "in.jsonl", "w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": i, "text": f"t{i}"}) + "\n")
    (tmp_path / "fn.py").write_text(FUNCTION)
    config = {
        "processors": [
            {"type": "custom", "script_path": str(tmp_path / "fn.py"), "function_name": "shout"}
        ],
        "loading_params": {
            "datasets": [
                {
                    "path": str(tmp_path / "in.jsonl"),
                    "type": "JSONL",
                    "output_dir": str(tmp_path / "out"),
                }
            ],
            "num_shards": num_shards,
            "batch_size": batch_size,
            "state_dir": str(tmp_path / "state"),
            "output_format": "jsonl",
            **loading,
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "loud", "type": "custom"}],
            "output_schema": {"loud": "{{ loud }}"},
        },
        "execution_params": execution or {},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def statuses(tmp_path: Path) -> dict[int, dict[str, Any]]:
    found = {}
    for path in (tmp_path / "state").glob("pipeline-*/shard_*/status.json"):
        found[int(path.parent.name.removeprefix("shard_"))] = json.loads(path.read_text())
    return found


def block_publish(tmp_path: Path, shard: int, num_shards: int = 2) -> Path:
    """A directory where shard ``shard`` must publish its file: every publish fails."""
    blocker = tmp_path / "out" / f"shard-{shard}-of-{num_shards}.jsonl"
    blocker.mkdir(parents=True)
    (blocker / "squatter").write_text("x")
    return blocker


def published_keys(tmp_path: Path, num_shards: int = 2) -> list[str]:
    keys = []
    for k in range(num_shards):
        path = tmp_path / "out" / f"shard-{k}-of-{num_shards}.jsonl"
        keys += [json.loads(line)["__row_key__"] for line in path.read_text().splitlines()]
    return keys


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def checkpointed(tmp_path: Path, shard: int = 0, num_shards: int = 1) -> int:
    path = tmp_path / "out" / ".parts" / f"shard-{shard}-of-{num_shards}.ckpt.json"
    try:
        return int(json.loads(path.read_text())["rows_done"])
    except (FileNotFoundError, ValueError, KeyError):
        return 0


# -- retry ------------------------------------------------------------------------------------


def test_retry_gives_a_failed_shard_exactly_max_retries_retries(tmp_path: Path) -> None:
    config = cli_config(tmp_path, execution={"max_retries": 2})
    blocker = block_publish(tmp_path, 1)

    ran = mmirage("run", str(config))
    assert ran.returncode == 1
    assert [statuses(tmp_path)[k]["attempts"] for k in (0, 1)] == [1, 1]

    retried = mmirage("retry", str(config))
    assert retried.returncode == 1, retried.stderr
    summary = json.loads(retried.stdout)
    assert summary == {
        "total": 2,
        "successful": 1,
        "running": 0,
        "failed": 0,
        "max_retries_exceeded": 1,
    }
    state = statuses(tmp_path)
    assert state[1]["attempts"] == 3  # 1 + max_retries, not the original's max_retries + 2
    assert state[0]["attempts"] == 1 and "shard 0/2" not in retried.stderr  # succeeded: skipped

    again = mmirage("retry", str(config))  # out of retries: nothing runs
    assert again.returncode == 1 and "shard 1/2: out of retries" in again.stderr
    assert statuses(tmp_path)[1]["attempts"] == 3

    blocker.joinpath("squatter").unlink()
    blocker.rmdir()
    assert mmirage("retry", str(config)).returncode == 1  # still exhausted
    forced = mmirage("run", str(config), "--force-retry")
    assert forced.returncode == 0, forced.stderr
    done = mmirage("retry", str(config))
    assert done.returncode == 0 and done.stderr == ""  # one form: the summary on stdout
    assert json.loads(done.stdout)["successful"] == 2
    assert sorted(published_keys(tmp_path)) == sorted(f"0::{i}" for i in range(ROWS))


def test_retry_from_scratch_with_no_retries_runs_each_shard_once(tmp_path: Path) -> None:
    config = cli_config(tmp_path, execution={"max_retries": 0})
    block_publish(tmp_path, 1)
    retried = mmirage("retry", str(config), "--stats")
    assert retried.returncode == 1
    assert "shard 0/2: done" in retried.stderr  # a never-run shard is run
    state = statuses(tmp_path)
    assert (state[0]["status"], state[0]["attempts"]) == ("success", 1)
    assert (state[1]["status"], state[1]["attempts"]) == ("failed", 1)  # the original: 2
    doc = json.loads(retried.stdout)
    assert doc["max_retries_exceeded"] == 1
    assert doc["stats"]["aggregate"]["total_rows_done"] == ROWS // 2


def test_kill_resume_sequence_keeps_counters_consistent(tmp_path: Path) -> None:
    config = cli_config(tmp_path, num_shards=1)

    # 1. kill -9 mid-shard: status.json stays "running", and check reports it stale.
    # 0.4 s a row: checkpoints come every second (and at the first row), so each run still
    # has rows to go when it is stopped.
    first = start("run", str(config), delay=0.4)
    wait_for(lambda: checkpointed(tmp_path) >= 3, "3 checkpointed rows")
    first.send_signal(signal.SIGKILL)
    first.communicate()
    checked = mmirage("check", str(config))
    assert checked.returncode == 1 and re.search(r"^0\s+stale\s+1/4", checked.stdout, re.M)

    # 2. resume, then SIGTERM mid-way: recorded as failed ("interrupted"), counters >= 0.
    at_start = checkpointed(tmp_path)
    second = start("run", str(config), delay=0.4)
    wait_for(lambda: checkpointed(tmp_path) >= at_start + 2, "2 more checkpointed rows")
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=60)
    status = statuses(tmp_path)[0]
    assert (status["status"], status["error"], status["attempts"]) == ("failed", "interrupted", 2)
    assert status["rows_done"] == checkpointed(tmp_path) >= at_start + 2
    assert status["stats"]["rows_done"] == status["rows_done"]
    assert status["stats"]["rows_processed"] == status["rows_done"] - at_start
    assert status["stats"]["throughput_rows_per_sec"] > 0
    checked = mmirage("check", str(config))
    assert re.search(
        rf"^0\s+failed\s+2/4\s+{status['rows_done']}\s+0\s+\d+s ago\s+interrupted$",
        checked.stdout,
        re.M,
    )
    assert not re.search(r"\s-\d", checked.stdout)
    report = json.loads(mmirage("stats", str(config)).stdout)
    assert report["per_shard"][0]["stats"]["rows_processed"] >= 0

    # 3. retry finishes it: every row exactly once, counters add up.
    at_start = checkpointed(tmp_path)
    retried = mmirage("retry", str(config))
    assert retried.returncode == 0, retried.stderr
    status = statuses(tmp_path)[0]
    assert (status["status"], status["attempts"], status["rows_done"]) == ("success", 3, ROWS)
    assert status["stats"]["rows_processed"] == ROWS - at_start > 0
    keys = published_keys(tmp_path, num_shards=1)
    assert keys == [f"0::{i}" for i in range(ROWS)]
    aggregate = json.loads(mmirage("stats", str(config)).stdout)["aggregate"]
    assert aggregate["total_rows"] == ROWS
    assert aggregate["total_rows_processed"] == ROWS - at_start
    assert aggregate["overall_throughput_rows_per_sec"] > 0


# -- run: conflicts and path errors -----------------------------------------------------------


def test_a_shard_held_elsewhere_does_not_stop_the_others(tmp_path: Path) -> None:
    from mmirage.config import load_mmirage_config
    from mmirage.core.shard.state import shard_lock
    from mmirage.rundir import RunDir

    config = cli_config(tmp_path, num_shards=3)
    cfg = load_mmirage_config(config)
    with shard_lock(RunDir.of(cfg).shard_lock_path(0), 0):  # "another process" runs shard 0
        ran = mmirage("run", str(config))
    assert ran.returncode == 1
    lines = ran.stderr.splitlines()
    assert "shard 1/3: done" in ran.stderr and "shard 2/3: done" in ran.stderr
    assert lines[-1] == "error: 1 of 3 shard(s) did not succeed: [0]"
    assert "being run by another process" in lines[-2]  # repeated at the end, not lost above
    assert "Traceback" not in ran.stderr
    assert mmirage("run", str(config)).returncode == 0  # released: it runs


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ")
    return line


def test_an_output_dir_that_is_a_file_exits_2(tmp_path: Path) -> None:
    config = cli_config(tmp_path)
    (tmp_path / "out").write_text("not a directory")
    line = one_line_error(mmirage("run", str(config)))
    assert line == (
        f"error: loading_params.datasets[0].output_dir: {tmp_path / 'out'} is a file, not a "
        "directory; move the file away or choose another path"
    )


def test_a_state_dir_under_a_file_exits_2(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    config = cli_config(tmp_path, state_dir=str(tmp_path / "plain" / "state"))
    line = one_line_error(mmirage("run", str(config)))
    assert line.startswith(f"error: loading_params.state_dir: {tmp_path / 'plain'} is a file")
    assert one_line_error(mmirage("retry", str(config))).startswith(
        "error: loading_params.state_dir:"
    )


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux sysfs")
def test_an_unwritable_output_dir_exits_2(tmp_path: Path) -> None:
    # sysfs refuses new directories even to root, where chmod would not.
    config = cli_config(tmp_path)
    raw = json.loads(config.read_text())
    raw["loading_params"]["datasets"][0]["output_dir"] = "/sys/mmirage-test-output"
    config.write_text(json.dumps(raw))
    line = one_line_error(mmirage("run", str(config)))
    assert line == (
        "error: loading_params.datasets[0].output_dir: /sys/mmirage-test-output is not "
        "writable; give write permission or choose another directory"
    )


def test_a_merge_output_root_under_a_file_exits_2(tmp_path: Path) -> None:
    config = cli_config(tmp_path)
    assert mmirage("run", str(config)).returncode == 0
    (tmp_path / "root").write_text("x")
    merged = mmirage("merge", str(config), "--output-root", str(tmp_path / "root" / "sub"))
    line = one_line_error(merged)
    assert line == (
        f"error: --output-root: {tmp_path / 'root'} is a file, not a directory; move the file "
        "away or choose another path"
    )


# -- check ------------------------------------------------------------------------------------


def test_check_prints_a_shard_table_and_a_summary(tmp_path: Path) -> None:
    config = cli_config(tmp_path, num_shards=3, execution={"max_retries": 0})
    block_publish(tmp_path, 1, num_shards=3)
    assert mmirage("run", str(config), "--shard-id", "0").returncode == 0
    assert mmirage("run", str(config), "--shard-id", "1").returncode == 1

    checked = mmirage("check", str(config))
    assert checked.returncode == 1
    header, row0, row1, row2, summary = checked.stdout.splitlines()
    assert header.split() == ["SHARD", "STATUS", "ATTEMPTS", "ROWS", "FAILED", "HEARTBEAT", "ERROR"]
    assert re.fullmatch(r"0\s+success\s+1/1\s+4\s+0\s+\d+s ago", row0)
    assert re.match(r"1\s+exhausted\s+1/1\s+4\s+0\s+\d+s ago\s+IsADirectoryError: ", row1)
    assert re.fullmatch(r"2\s+missing\s+0/1\s+0\s+0\s+-", row2)
    assert summary == "3 shard(s): 1 exhausted, 1 missing, 1 success; 8 rows done, 0 failed"

    assert mmirage("run", str(config), "--shard-id", "2").returncode == 0
    (tmp_path / "out" / "shard-1-of-3.jsonl" / "squatter").unlink()
    (tmp_path / "out" / "shard-1-of-3.jsonl").rmdir()
    assert mmirage("run", str(config), "--force-retry").returncode == 0
    checked = mmirage("check", str(config))
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.splitlines()[-1] == "3 shard(s): 3 success; 12 rows done, 0 failed"
