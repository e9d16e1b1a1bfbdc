"""What Ray costs: the same pipeline and shard count in ``mode: local``
(``local_parallel_shards`` = shards) and in ``mode: ray`` on a local two-node Ray cluster, side
by side in one run, against the same emulator: rows/s of each, their ratio (goal >= 0.90) and
the driver's (``mmirage run``'s own process) peak RSS.

Everything runs inside one loopback-only network namespace (``unshare -n``; root), as in
tests/test_ray_mode.py, through its ``ray_support`` driver: the cluster is started once, then
the rounds alternate local, ray, local, ray, ...; medians compared. The cluster's start (tens of
seconds here) is not counted: a Ray cluster is there before the run.

    python benchmarks/ray_overhead.py [--rows 24000] [--shards 4] [--rounds 3]

A Ray run pays a fixed cost a local one does not (joining the cluster, about 1.5 s here, and the
first task's imports on each node, about 0.7 s): the ratio grows with the run's length.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from _common import report

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from ray_support import can_unshare, in_namespace  # noqa: E402


def pipeline(tmp: Path, mode: str, round_no: int, shards: int, concurrency: int) -> str:
    where = tmp / f"{mode}-{round_no}"
    body: dict[str, Any] = {
        "processors": [
            {
                "type": "llm",
                "base_url": "{base_url}",
                "model": "echo",
                "worker_concurrency": concurrency,
            }
        ],
        "loading_params": {
            "state_dir": str(where / "state"),
            "datasets": [
                {"path": str(tmp / "rows.jsonl"), "type": "JSONL", "output_dir": str(where / "out")}
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
            "local_parallel_shards": shards,
            "ray": {"num_cpus": 1},
        },
    }
    return yaml.safe_dump(body, sort_keys=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=24_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency", type=float, default=0.01, help="the emulator's, seconds")
    args = parser.parse_args()
    if why := can_unshare():
        raise SystemExit(f"no loopback-only network namespace here: {why}")
    with tempfile.TemporaryDirectory(prefix="ray-bench-") as name:
        tmp = Path(name)
        with open(tmp / "rows.jsonl", "w") as f:
            f.writelines(json.dumps({"text": f"row {i}"}) + "\n" for i in range(args.rows))
        configs, commands = {}, []
        for round_no in range(args.rounds):
            for mode in ("local", "ray"):
                key = f"{mode}-{round_no}"
                configs[key] = pipeline(tmp, mode, round_no, args.shards, args.concurrency)
                commands.append({"args": ["run"], "config": key, "mode": mode})
        spec = {
            "workdir": str(tmp / "driver"),
            "configs": configs,
            "commands": commands,
            "latency_s": args.latency,
            # Each node offers half the shards' CPUs: the shards spread over both nodes.
            "cpus_per_node": max(1, args.shards // 2),
        }
        result = in_namespace(spec, timeout=3600)
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "ray": []}
    for command, done in zip(commands, result["commands"], strict=True):
        if done["returncode"] != 0:
            raise SystemExit(f"{command['config']} failed: {done['stderr'][-2000:]}")
        runs[str(command["mode"])].append(done)
    rate = {mode: [args.rows / d["seconds"] for d in done] for mode, done in runs.items()}
    rss = {mode: max(d["peak_rss_mb"] for d in done) for mode, done in runs.items()}
    local, ray = statistics.median(rate["local"]), statistics.median(rate["ray"])
    report(
        f"ray overhead: {args.shards} shards x {args.rows // args.shards:,} rows, "
        f"emulator latency {args.latency:g} s, concurrency {args.concurrency} per shard",
        [
            (
                f"local mode ({args.shards} parallel shards)",
                f"{local:8.1f} rows/s  (runs: {_list(rate['local'])}); "
                f"driver peak RSS {rss['local']:.0f} MB",
            ),
            (
                "ray mode (two-node cluster)",
                f"{ray:8.1f} rows/s  (runs: {_list(rate['ray'])}); "
                f"driver peak RSS {rss['ray']:.0f} MB",
            ),
            ("ratio ray / local rows/s", f"{ray / local:.2f}  (goal >= 0.90)"),
        ],
    )


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values)


if __name__ == "__main__":
    main()
