"""``mmirage view`` at scale: page latency and the server's memory at 1,000 shards / 10M rows.

Builds a pipeline's state synthetically: one shard of ROWS / SHARDS rows is written once (a
third of its rows failed, as a run records them), then linked into place for every shard, so
the folder holds 10M rows without writing 10M rows (the viewer reads each link as its own
file). RUNNING shards are left running (a part file, a fresh heartbeat), the others published
with their checkpoints and status.json. Then ``mmirage view`` runs as a subprocess and this
times, over plain HTTP: the landing page, a row's page and a rows-table page deep in a shard
(its last 50 rows, by byte offset), while the failure counter reads the 10M rows in the
background and after it has; and reads the server's RSS (now and peak) from /proc.

    python benchmarks/view_page.py [--shards 1000] [--rows 10000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import yaml

RUNNING = 10  # shards shown as running
REPEAT = 20  # requests timed per page


def build(root: Path, shards: int, rows: int) -> Path:
    per_shard = rows // shards
    out = root / "out"
    (out / ".parts").mkdir(parents=True)
    source = root / "rows.jsonl"
    with open(source, "wb") as f:  # only counted by the viewer (pending rows), never read
        for _ in range(rows // 100_000):
            f.write(b'{"text":"x"}\n' * 100_000)
    config = {
        "processors": [
            {"type": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "gpt-4o-mini"}
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "num_shards": shards,
            "datasets": [{"path": str(source), "type": "JSONL", "output_dir": str(out)}],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Summarize: {{ text }}"}],
            "output_schema": {"text": "{{ text }}", "answer": "{{ answer }}"},
        },
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    template = root / "template.jsonl"
    failed = 0
    with open(template, "wb") as f:
        for i in range(per_shard):
            row: dict[str, object] = {
                "text": f"source text of row {i} " * 3,
                "__row_key__": f"0::{i}",
            }
            if i % 3 == 0:
                failed += 1
                row |= {
                    "answer": None,
                    "__errors__": {"answer": "openai answered HTTP 429: slow down (rate_limit)"},
                }
            else:
                row |= {"answer": f"a summary of row {i}", "__errors__": None}
            row["__usage__"] = {"input_tokens": 20, "output_tokens": 12}
            f.write(orjson.dumps(row) + b"\n")
    size = template.stat().st_size
    pipeline = _pipeline_id(path)
    now = datetime.now(UTC)
    for k in range(shards):
        name = f"shard-{k}-of-{shards}"
        running = k >= shards - RUNNING
        os.link(template, out / ".parts" / f"{name}.jsonl" if running else out / f"{name}.jsonl")
        ckpt = {
            "rows_done": per_shard,
            "rows_failed": failed,
            "offset": size,
            "complete": not running,
        }
        (out / ".parts" / f"{name}.ckpt.json").write_text(json.dumps(ckpt))
        start = now - timedelta(seconds=3600 - k * 3)
        status = {
            "status": "running" if running else "success",
            "shard_id": k,
            "attempts": 1,
            "rows_done": per_shard,
            "rows_failed": failed,
            "rows_retryable": failed,
            "input_tokens": 20 * per_shard,
            "output_tokens": 12 * per_shard,
            "started_at": start.isoformat(),
            "heartbeat": now.isoformat(),
            "finished_at": None if running else (start + timedelta(seconds=600)).isoformat(),
            "stats": {
                "rows_processed": per_shard,
                "requests": {
                    "live": True,
                    "input_tokens": 20 * per_shard,
                    "output_tokens": 12 * per_shard,
                    "cost_usd": per_shard * 1e-5,
                    "retries": {},
                    "cooldown_seconds": 0.0,
                    "unpriced": [],
                },
            },
        }
        shard_dir = root / "state" / pipeline / f"shard_{k}"
        shard_dir.mkdir(parents=True)
        (shard_dir / "status.json").write_text(json.dumps(status))
    template.unlink()
    return path


def _pipeline_id(config: Path) -> str:
    from mmirage.config import load_mmirage_config
    from mmirage.rundir import pipeline_id

    return pipeline_id(load_mmirage_config(config))


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB: now and peak."""
    text = Path(f"/proc/{pid}/status").read_text()
    now = int(re.search(r"VmRSS:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    peak = int(re.search(r"VmHWM:\s+(\d+)", text).group(1))  # type: ignore[union-attr]
    return now / 1024, peak / 1024


def timed(url: str) -> tuple[float, float, int]:
    """Median and max milliseconds of REPEAT requests of ``url`` (after one warm-up), bytes."""
    with urllib.request.urlopen(url, timeout=60) as r:
        size = len(r.read())
    times = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        with urllib.request.urlopen(url, timeout=60) as r:
            r.read()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times), max(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="build here and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="view-bench-"))
    t = time.perf_counter()
    config = build(root, args.shards, args.rows)
    print(f"built {args.shards} shards / {args.rows:,} rows in {time.perf_counter() - t:.1f} s")
    per_shard = args.rows // args.shards
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmirage", "view", str(config), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = re.search(r"(http://\S+?/)", proc.stdout.readline()).group(1)  # type: ignore[union-attr]
        deep = (root / "out" / f"shard-0-of-{args.shards}.jsonl").read_bytes()
        offset = deep.rindex(b"\n", 0, len(deep) - 1)
        last_row = offset + 1
        for _ in range(50):  # the offset of the 50th row from the end
            offset = deep.rindex(b"\n", 0, offset)
        q = "dataset=0&shard=0"
        pages = {
            "landing page": url,
            "row page (last row of shard 0)": f"{url}row?{q}&where=published&offset={last_row}",
            f"rows table at row {per_shard - 50:,}": f"{url}rows?{q}&offset={offset + 1}",
            "rows table, failed only, deep": f"{url}rows?{q}&status=failed&offset={offset + 1}",
        }
        started = time.perf_counter()
        for when in ("while the failures are counted", "after they are counted"):
            if when.startswith("after"):
                while (
                    "counting" in urllib.request.urlopen(url).read().decode()
                    or _counted(url) < args.rows // 3
                ):
                    time.sleep(2)
                took = time.perf_counter() - started
                print(f"failures of {args.rows:,} rows counted {took:.0f} s after the start")
            print(f"-- {when}")
            for label, page in pages.items():
                median, worst, size = timed(page)
                print(f"{label:42s} median {median:6.1f} ms, max {worst:6.1f} ms ({size:,} bytes)")
            now, peak = rss_mb(proc.pid)
            print(f"server RSS now {now:.0f} MB, peak {peak:.0f} MB")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


def _counted(url: str) -> int:
    body = urllib.request.urlopen(url).read().decode()
    found = re.search(r"<td>rate_limit</td><td>([\d,]+)</td>", body)
    return int(found.group(1).replace(",", "")) if found else 0


if __name__ == "__main__":
    main()
