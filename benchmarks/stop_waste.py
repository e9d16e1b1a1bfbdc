"""What a stop costs in requests paid twice: a shard stopped mid-run, then resumed, for each kind
of stop. Every stop now drains: no new request, the requests in flight come back and are
stored (``stop_grace_seconds``, 20 s by default), then the process exits 130 (Ctrl-C) or 143
(SIGTERM: kill, scancel, a job manager; the SLURM time limit). The stop before this, at once,
is ``stop_grace_seconds: 0``: it abandons the requests in flight, which the resume sends again
(about ``worker_concurrency`` of them).

Target: 0 requests paid twice per graceful stop, for a stop that takes about one request's
latency longer.

The real CLI in local mode (the task's own signal handling; the deadline is the environment
variable the SLURM job script exports), the emulator in its own process with a latency of
``--latency`` to twice that. Runs alternate between the stops; medians compared.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import report
from mmirage.core.shard.stop import DEADLINE_ENV
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle
from slurm_overhead import config


@dataclass(frozen=True)
class Stop:
    name: str
    signum: int
    execution: dict[str, Any] = field(default_factory=dict)
    time_limit: bool = False  # SIGTERM with the task's SLURM deadline near, as --signal sends it


STOPS = (
    Stop("at once (before: stop_grace_seconds 0)", signal.SIGTERM, {"stop_grace_seconds": 0}),
    Stop("Ctrl-C (SIGINT to the process group)", signal.SIGINT),
    Stop("SIGTERM (kill, scancel, a job manager)", signal.SIGTERM),
    Stop("SLURM time limit (SIGTERM near the deadline)", signal.SIGTERM, time_limit=True),
)


def checkpointed(out: Path) -> int:
    try:
        return int(
            json.loads((out / ".parts" / "shard-0-of-1.ckpt.json").read_bytes())["rows_done"]
        )
    except (FileNotFoundError, ValueError, KeyError):
        return 0


def stop_and_resume(
    emu: EmulatorHandle, tmp: Path, stop: Stop, rows: int, concurrency: int, after_s: float
) -> tuple[int, float]:
    """(requests paid twice, seconds from the signal to the process's exit)."""
    shutil.rmtree(tmp / "local", ignore_errors=True)
    path = config(tmp, emu.openai_base_url, "local", 1, rows, concurrency, **stop.execution)
    env = {**os.environ, "OPENAI_API_KEY": "sk-bench"}
    first = dict(env)
    if stop.time_limit:  # as SLURM's --signal does, well before the end
        first[DEADLINE_ENV] = str(int(time.time()) + 150)
    emu.reset_stats()
    run = subprocess.Popen(
        [sys.executable, "-m", "mmirage", "run", str(path)],
        env=first,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal runs a command
    )
    while not checkpointed(tmp / "local" / "out"):
        if run.poll() is not None:
            raise SystemExit(f"the run ended before its first checkpoint: {run.stderr}")
        time.sleep(0.05)
    time.sleep(after_s)
    os.killpg(run.pid, stop.signum)
    started = time.perf_counter()
    _, stderr = run.communicate(timeout=300)
    stopping = time.perf_counter() - started
    if run.returncode != 128 + stop.signum:
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
    # Started with Ctrl-C ignored (``... &`` in a script), the runs would ignore it too.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    twice: dict[str, list[int]] = {stop.name: [] for stop in STOPS}
    stopping: dict[str, list[float]] = {stop.name: [] for stop in STOPS}
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
                twice[stop.name].append(paid)
                stopping[stop.name].append(took)

    def line(stop: Stop) -> str:
        return (
            f"{statistics.median(twice[stop.name]):5.0f} paid twice per stop, stop in "
            f"{statistics.median(stopping[stop.name]):.2f} s  (runs: {twice[stop.name]}; "
            + ", ".join(f"{s:.2f} s" for s in stopping[stop.name])
            + ")"
        )

    report(
        f"stop waste: {args.rows:,} rows, worker_concurrency {args.concurrency}, "
        f"latency {args.latency:g}-{2 * args.latency:g} s, stopped mid-run then resumed",
        [
            *((stop.name, line(stop)) for stop in STOPS),
            ("target for every graceful stop", "0 paid twice"),
        ],
    )


if __name__ == "__main__":
    main()
