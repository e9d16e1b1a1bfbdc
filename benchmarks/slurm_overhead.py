"""What SLURM costs: 8 shards in slurm mode on the single-node dev cluster vs local mode
(``local_parallel_shards: 8``), same rows, same emulator; and ``mmirage check`` on a
1,000-task array (target <= 2 s: one squeue call for the whole array).

Brings up the dev cluster (scripts/slurm-dev-cluster.sh: root; it installs Debian's slurm-wlm
packages when missing) unless SLURM_CONF is set. Runs alternate (local, slurm, ...); medians
compared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from _common import report
from provider_emulator import EmulatorConfig, running_emulator

ROOT = Path(__file__).resolve().parents[1]


def config(
    tmp: Path,
    base_url: str,
    mode: str,
    shards: int,
    rows: int,
    concurrency: int = 16,
    **extra: Any,
) -> Path:
    data = tmp / "data.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(rows)))
    body = {
        "processors": [
            {"type": "llm", "base_url": base_url, "model": "m", "worker_concurrency": concurrency}
        ],
        "loading_params": {
            "state_dir": str(tmp / mode / "state"),
            "datasets": [
                {"path": str(data), "type": "JSONL", "output_dir": str(tmp / mode / "out")}
            ],
            "num_shards": shards,
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "{{ text }}"}],
            "output_schema": {"answer": "{{ answer }}"},
        },
        "execution_params": {
            "mode": mode,
            "account": "bench",
            "gpus": 0,
            "cpus_per_task": 1,
            "report_dir": str(tmp / mode / "reports"),
            "local_parallel_shards": shards,
            "poll_interval_seconds": 0.5,
            "settle_time_seconds": 0,
            **extra,
        },
    }
    path = tmp / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def wall(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "mmirage", *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"mmirage {' '.join(args)} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--array", type=int, default=1_000)
    args = parser.parse_args()
    if not os.environ.get("SLURM_CONF"):
        up = subprocess.run(
            ["bash", str(ROOT / "scripts" / "slurm-dev-cluster.sh"), "up"],
            capture_output=True,
            text=True,
        )
        if up.returncode != 0:
            raise SystemExit(f"no SLURM dev cluster here: {up.stderr.strip()}")
        os.environ["SLURM_CONF"] = up.stdout.strip().rsplit("=", 1)[-1]
    env = {**os.environ, "OPENAI_API_KEY": "sk-bench"}
    walls: dict[str, list[float]] = {"local": [], "slurm": []}
    with (
        running_emulator(EmulatorConfig(), subprocess=True) as emu,
        tempfile.TemporaryDirectory() as name,
    ):
        tmp = Path(name)
        for _ in range(args.rounds):
            for mode in ("local", "slurm"):
                shutil.rmtree(tmp / mode, ignore_errors=True)
                path = config(tmp, emu.openai_base_url, mode, 8, args.rows)
                run = ["run", str(path)] + (["--wait"] if mode == "slurm" else [])
                walls[mode].append(wall(run, env))
        # check on a big array: tasks that end at once (a setup line exits before mmirage).
        path = config(tmp, emu.openai_base_url, "slurm", args.array, args.array, setup=["exit 0"])
        shutil.rmtree(tmp / "slurm", ignore_errors=True)
        job = subprocess.run(
            [sys.executable, "-m", "mmirage", "run", str(path)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        checks = []
        for _ in range(5):
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "mmirage", "check", str(path)],
                env=env,
                capture_output=True,
                text=True,
            )
            checks.append(time.perf_counter() - started)
        subprocess.run(["scancel", job], check=False)

    local, slurm = statistics.median(walls["local"]), statistics.median(walls["slurm"])
    report(
        f"slurm overhead: 8 shards x {args.rows // 8:,} rows, emulator in its own process",
        [
            ("local mode (8 parallel shards)", f"{local:6.2f} s  (runs: {_list(walls['local'])})"),
            (
                "slurm mode (8-task array, --wait)",
                f"{slurm:6.2f} s  (runs: {_list(walls['slurm'])})",
            ),
            ("ratio slurm / local", f"{slurm / local:.2f}  (the scheduler's cost)"),
            (
                f"mmirage check, {args.array:,}-task array",
                f"{statistics.median(checks):.2f} s median  (target <= 2 s; runs: {_list(checks)})",
            ),
        ],
    )


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
