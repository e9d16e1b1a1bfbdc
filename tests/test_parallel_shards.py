"""``execution_params.local_parallel_shards``: ``mmirage run`` / ``retry`` run up to N shards at
once as child processes, through the real CLI. The custom function logs which shard process
called it and when, so the tests can see how many shards really ran at the same time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from test_graceful_stop import ctrl_c_not_ignored
from test_retry_cli import (
    block_publish,
    cli_config,
    mmirage,
    published_keys,
    start,
    statuses,
    wait_for,
)

SHARDS = 4
ROWS = 12
LOGGING_FUNCTION = """
import os
import time


def shout(variables):
    began = time.time()
    if os.environ.get("BEGAN_LOG"):  # which shard processes are inside a call (the parent's pid)
        with open(os.environ["BEGAN_LOG"], "a") as log:
            log.write(f"{os.getppid()}\\n")
    while os.path.exists(os.environ.get("HOLD") or ""):  # a test holds every row
        time.sleep(0.05)
    time.sleep(float(os.environ.get("ROW_DELAY") or 0))
    with open(os.environ["CALL_LOG"], "a") as log:
        log.write(f"{os.getppid()} {began} {time.time()}\\n")
    return variables["text"].upper()
"""


@pytest.fixture
def call_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("CALL_LOG", str(log))
    return log


def parallel_config(tmp_path: Path, width: int, **execution: Any) -> Path:
    config = cli_config(
        tmp_path,
        num_shards=SHARDS,
        execution={"local_parallel_shards": width, **execution},
    )
    (tmp_path / "fn.py").write_text(LOGGING_FUNCTION)
    return config


def most_at_once(log: Path) -> int:
    """The most shard processes whose calls overlapped in time."""
    spans: dict[str, tuple[float, float]] = {}
    for line in log.read_text().splitlines():
        pid, began, ended = line.split()
        lo, hi = spans.get(pid, (float(began), float(ended)))
        spans[pid] = (min(lo, float(began)), max(hi, float(ended)))
    events = sorted([(lo, 1) for lo, _ in spans.values()] + [(hi, -1) for _, hi in spans.values()])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def test_run_runs_n_shards_at_once_with_prefixed_lines(
    tmp_path: Path, call_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The rows wait while HOLD exists, until two shard processes are inside a call at the same
    # moment: their calls overlap however slowly the machine starts them.
    hold, began = tmp_path / "hold", tmp_path / "began.log"
    hold.touch()
    monkeypatch.setenv("HOLD", str(hold))
    monkeypatch.setenv("BEGAN_LOG", str(began))
    config = parallel_config(tmp_path, width=2)
    run = start("run", str(config), "--stats", delay=0)
    try:
        wait_for(lambda: began.exists() and len(set(began.read_text().split())) == 2, "two calls")
    finally:
        hold.unlink()
    out, err = run.communicate(timeout=240)
    ran = subprocess.CompletedProcess(run.args, run.returncode, out, err)
    assert ran.returncode == 0, ran.stderr
    assert most_at_once(call_log) == 2  # never more than local_parallel_shards
    for k in range(SHARDS):
        assert f"[shard {k}] shard {k}/{SHARDS}: done" in ran.stderr
    stats = json.loads(ran.stdout)
    assert [s["shard_id"] for s in stats["per_shard"]] == list(range(SHARDS))
    assert stats["aggregate"]["total_rows_done"] == ROWS
    assert published_keys(tmp_path, SHARDS) == [f"0::{i}" for i in range(ROWS)]
    assert {s["attempts"] for s in statuses(tmp_path).values()} == {1}

    again = mmirage("run", str(config))
    assert again.returncode == 0 and again.stderr.count("already done, skipped") == SHARDS


def test_one_width_runs_shards_one_after_another(tmp_path: Path, call_log: Path) -> None:
    config = parallel_config(tmp_path, width=1)
    ran = mmirage("run", str(config), delay=0.1)
    assert ran.returncode == 0, ran.stderr
    assert most_at_once(call_log) == 1 and "[shard" not in ran.stderr  # all in this process


def test_exit_code_aggregates_the_children(tmp_path: Path, call_log: Path) -> None:
    config = parallel_config(tmp_path, width=3)
    block_publish(tmp_path, 2, num_shards=SHARDS)
    ran = mmirage("run", str(config))
    assert ran.returncode == 1
    assert ran.stderr.splitlines()[-1] == f"error: 1 of {SHARDS} shard(s) did not succeed: [2]"
    state = statuses(tmp_path)
    assert [state[k]["status"] for k in range(SHARDS)] == [
        "success",
        "success",
        "failed",
        "success",
    ]


def live(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by its exited parent's reaper) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def running_children(tmp_path: Path) -> list[int]:
    return [
        s["pid"]
        for s in statuses(tmp_path).values()
        if s.get("status") == "running" and live(s["pid"])
    ]


@pytest.mark.usefixtures(ctrl_c_not_ignored.__name__)
@pytest.mark.parametrize(
    ("how", "exit_code"),
    [
        ("SIGTERM", 128 + signal.SIGTERM),
        ("SIGKILL", -signal.SIGKILL),
        ("Ctrl-C", 128 + signal.SIGINT),
    ],
)
def test_stopping_the_parent_stops_the_children(
    tmp_path: Path, call_log: Path, how: str, exit_code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every row waits while HOLD exists: no shard can finish before the stop, however slow the
    # machine (a shard that finished first would rightly make the parent exit 0).
    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv("HOLD", str(hold))
    config = parallel_config(tmp_path, width=2)
    parent = start("run", str(config), delay=0, start_new_session=True)
    try:
        wait_for(lambda: len(running_children(tmp_path)) == 2, "two running shards")
        children = running_children(tmp_path)
        if how == "SIGTERM":
            parent.send_signal(signal.SIGTERM)
        elif how == "SIGKILL":
            parent.send_signal(signal.SIGKILL)
        else:  # what a terminal does: SIGINT to the whole foreground process group
            os.killpg(parent.pid, signal.SIGINT)
        # Each child records its stop before it waits for its rows in flight to end.
        wait_for(
            lambda: all(s.get("status") == "failed" for s in statuses(tmp_path).values()),
            "the children to record the stop",
        )
    finally:
        hold.unlink()
    _, err = parent.communicate(timeout=60)
    assert parent.returncode == exit_code, err
    wait_for(lambda: not any(live(pid) for pid in children), "the children to stop", 30)
    state = statuses(tmp_path)
    for k, status in state.items():
        assert status["status"] == "failed" and status["error"] == "interrupted", (k, err)
    assert len(state) == 2  # the waiting shards never started

    # The interrupted shards resume, the others start: retry (in parallel too) finishes all.
    retried = mmirage("retry", str(config))
    assert retried.returncode == 0, retried.stderr
    assert f"[shard {SHARDS - 1}]" in retried.stderr
    assert published_keys(tmp_path, SHARDS) == [f"0::{i}" for i in range(ROWS)]
    assert {statuses(tmp_path)[k]["attempts"] for k in state} == {2}
    assert {statuses(tmp_path)[k]["attempts"] for k in range(SHARDS) if k not in state} == {1}


def test_parallel_children_share_one_run_id(tmp_path: Path, call_log: Path) -> None:
    # A child is `mmirage run CONFIG --shard-id K --run-id R`, R drawn once by the parent (the
    # custom function runs in a spawned worker, which keeps the shard process's argv).
    config = parallel_config(tmp_path, width=2)
    probe = tmp_path / "fn.py"
    probe.write_text(
        LOGGING_FUNCTION
        + "\n\ndef run_id(variables):\n"
        + "    import sys\n"
        + "    argv = sys.argv\n"
        + "    return argv[argv.index('--run-id') + 1] if '--run-id' in argv else ''\n"
    )
    raw = json.loads(config.read_text())
    raw["processors"][0]["function_name"] = "run_id"
    config.write_text(json.dumps(raw))
    ran = mmirage("run", str(config))
    assert ran.returncode == 0, ran.stderr
    ids = {
        json.loads(line)["loud"]
        for k in range(SHARDS)
        for line in (tmp_path / "out" / f"shard-{k}-of-{SHARDS}.jsonl").read_text().splitlines()
    }
    assert len(ids) == 1 and ids != {""}, ids
