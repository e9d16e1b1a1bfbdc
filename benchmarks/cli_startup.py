"""Wall time of `mmirage --help` (and of `mmirage run --help`), median of several runs.

Target: `mmirage --help` answers in <= 0.5 s (heavy packages are imported lazily). A bare
`python -c pass` is timed alongside, for the interpreter's own share on this machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import report

MMIRAGE = Path(sys.executable).with_name("mmirage")


def wall(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    cli = [str(MMIRAGE)] if MMIRAGE.exists() else [sys.executable, "-m", "mmirage"]
    commands = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "mmirage --help": [*cli, "--help"],
        "mmirage run --help": [*cli, "run", "--help"],
    }
    for command in commands.values():
        wall(command)  # warm the page cache and .pyc files
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):  # interleaved, so that machine noise hits each alike
        for name, command in commands.items():
            times[name].append(wall(command))
    rows = []
    for name, samples in times.items():
        target = "  (target <= 0.50 s)" if name == "mmirage --help" else ""
        rows.append(
            (
                name,
                f"median {statistics.median(samples):.3f} s  min {min(samples):.3f} s  "
                f"max {max(samples):.3f} s{target}",
            )
        )
    report(f"CLI startup: median of {args.runs} runs", rows)


if __name__ == "__main__":
    main()
