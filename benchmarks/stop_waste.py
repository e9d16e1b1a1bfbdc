"""What a stop costs in requests paid twice: a shard stopped mid-run, then resumed, side by
side for the two kinds of stop. An interruption (Ctrl-C, kill, scancel) stops at once and
abandons the requests in flight, which its resume sends again; a stop at the SLURM time limit
(SIGTERM with the task's deadline near) first lets them come back and journals them.

Target: 0 requests paid twice at the time limit (an interruption pays about
``worker_concurrency`` twice), for a stop that takes about one request's latency longer.

The real CLI in local mode (the task's own signal handling; the deadline is the environment
variable the SLURM job script exports), the emulator in its own process with a latency of
``--latency`` to twice that. Runs alternate (interrupt, time limit, ...); medians compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import report
from llm_kit.emulator import EmulatorConfig, running_emulator
from llm_kit.emulator.runner import EmulatorHandle
from mmirage.core.shard.stop import DEADLINE_ENV
from slurm_overhead import config

STOPS = ("interrupt", "time limit")


def checkpointed(out: Path) -> int:
    try:
        return int(
            json.loads((out / ".parts" / "shard-0-of-1.ckpt.json").read_bytes())["rows_done"]
        )
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def stop_and_resume(
    emu: EmulatorHandle, tmp: Path, stop: str, rows: int, concurrency: int, after_s: float
) -> tuple[int, float]:
    """(requests paid twice, seconds from SIGTERM to the process's exit)."""
    shutil.rmtree(tmp / "local", ignore_errors=True)
    path = config(tmp, emu.openai_base_url, "local", 1, rows, concurrency=concurrency)
    env = {**os.environ, "OPENAI_API_KEY": "sk-bench"}
    first = dict(env)
    if stop == "time limit":  # as SLURM's --signal does, well before the end
        first[DEADLINE_ENV] = str(int(time.time()) + 150)
    emu.reset_stats()
    run = subprocess.Popen(
        [sys.executable, "-m", "mmirage", "run", str(path)],
        env=first,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not checkpointed(tmp / "local" / "out"):
        if run.poll() is not None:
            raise SystemExit(f"the run ended before its first checkpoint: {run.stderr}")
        time.sleep(0.05)
    time.sleep(after_s)
    run.send_signal(signal.SIGTERM)
    started = time.perf_counter()
    _, stderr = run.communicate(timeout=300)
    stopping = time.perf_counter() - started
    if run.returncode != 128 + signal.SIGTERM:
        raise SystemExit(f"the stopped run exited {run.returncode}: {stderr[-2000:]}")
    resumed = subprocess.run(
        [sys.executable, "-m", "mmirage", "run", str(path)], env=env, capture_output=True, text=True
    )
    if resumed.returncode != 0:
        raise SystemExit(f"the resume failed: {resumed.stderr[-2000:]}")
    return int(emu.stats()["requests"]) - rows, stopping


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_500)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    twice: dict[str, list[int]] = {stop: [] for stop in STOPS}
    stopping: dict[str, list[float]] = {stop: [] for stop in STOPS}
    emulator = EmulatorConfig(latency_s=args.latency, latency_jitter_s=args.latency)
    with (
        running_emulator(emulator, subprocess=True) as emu,
        tempfile.TemporaryDirectory() as name,
    ):
        for _ in range(args.rounds):
            for stop in STOPS:
                paid, took = stop_and_resume(
                    emu, Path(name), stop, args.rows, args.concurrency, 2 * args.latency
                )
                twice[stop].append(paid)
                stopping[stop].append(took)

    def line(stop: str) -> str:
        return (
            f"{statistics.median(twice[stop]):5.0f} paid twice, stop in "
            f"{statistics.median(stopping[stop]):.2f} s  (runs: {twice[stop]}; "
            + ", ".join(f"{s:.2f} s" for s in stopping[stop])
            + ")"
        )

    report(
        f"stop waste: {args.rows:,} rows, worker_concurrency {args.concurrency}, "
        f"latency {args.latency:g}-{2 * args.latency:g} s, stopped mid-run then resumed",
        [
            ("interruption (Ctrl-C, kill, scancel)", line("interrupt")),
            ("SLURM time limit (drained first)", line("time limit")),
            ("target at the time limit", "0 paid twice"),
        ],
    )


if __name__ == "__main__":
    main()
