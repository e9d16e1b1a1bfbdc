"""Peak RSS of one shard over a 1,000,000-row JSONL (and over 100,000 rows, for the ratio).

Target: peak RSS at 1M rows <= 400 MB (rows stream: memory does not grow with the dataset).
The fast path: `run_shard(config, 0, processors={...})` with an in-process trivial processor
(the Processor protocol of mmirage.core.process.base), so that what is measured is the
pipeline itself (reading, variables, prompt, output_schema, part file, checkpoints, publish),
not a model. Each (size, output_format) runs in its own process, so each peak is its own; an
Arrow shard's peak is the run's plus its helper process's (which converts the part file): an
upper bound, as the two peaks need not coincide.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import peak_rss_mb, report
from mmirage.core.process.base import OutputResult, Processor


class Shout(Processor):
    """The trivial processor: the rendered prompt, upper-cased, with made-up token counts."""

    group_rows = 256

    async def process(self, output: Any, requests: Sequence[Any]) -> list[Any]:
        return [
            OutputResult(value=r.prompt.upper(), input_tokens=len(r.prompt) // 4, output_tokens=3)
            for r in requests
        ]


def write_data(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            row = {"id": i, "text": f"Row {i} says something short.", "meta": {"source": "bench"}}
            f.write(json.dumps(row) + "\n")


def child(data: str, work: str, fmt: str) -> None:
    from mmirage.config import load_mmirage_config_dict
    from mmirage.core.shard.runner import run_shard

    config = load_mmirage_config_dict(
        {
            "processors": [{"type": "llm", "model": "m", "message_format": "local"}],
            "loading_params": {
                "state_dir": f"{work}/state",
                "datasets": [{"path": data, "type": "JSONL", "output_dir": f"{work}/out"}],
                "batch_size": 256,
                "output_format": fmt,
            },
            "processing_params": {
                "inputs": [{"name": "id", "key": "id"}, {"name": "text", "key": "text"}],
                "outputs": [{"name": "loud", "type": "llm", "prompt": "Shout: {{ text }}"}],
                "output_schema": {"row": "{{ id }}", "loud": "{{ loud }}"},
            },
        },
        env={},
    )
    started = time.perf_counter()
    result = run_shard(config, 0, processors={"llm": Shout()})
    elapsed = time.perf_counter() - started
    assert result.rows_failed == 0, result
    published = Path(result.published[0])
    kind = "hf" if published.is_dir() else published.suffix.lstrip(".")
    # An Arrow shard's conversion runs in the run's helper process: its peak counts too.
    rss = peak_rss_mb() + peak_rss_mb(resource.RUSAGE_CHILDREN)
    print(f"{rss:.1f} {result.rows_done} {elapsed:.2f} {kind}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=3, metavar=("DATA", "WORK", "FORMAT"))
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--formats", default="jsonl,hf")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    sizes = [int(s) for s in args.sizes.split(",")]
    formats = args.formats.split(",")
    results: dict[tuple[int, str], tuple[float, int, float, str]] = {}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for n in sizes:
            data = tmp / f"rows-{n}.jsonl"
            write_data(data, n)
            for fmt in formats:
                work = tmp / f"work-{n}-{fmt}"
                done = subprocess.run(
                    [sys.executable, __file__, "--child", str(data), str(work), fmt],
                    capture_output=True,
                    text=True,
                )
                if done.returncode != 0:
                    raise SystemExit(f"{n} rows, {fmt}: {done.stderr[-2000:]}")
                fields = done.stdout.split()[-4:]
                assert int(fields[1]) == n, (fields, n)
                results[(n, fmt)] = (float(fields[0]), n, float(fields[2]), fields[3])
                shutil.rmtree(work)
            data.unlink()
    lines = []
    for (n, fmt), (rss, _, seconds, kind) in results.items():
        # What was really published, if the runner wrote another format than asked.
        note = "" if kind == fmt else f"  (asked {fmt}, published {kind})"
        lines.append(
            (
                f"{n:>9,} rows, {fmt:<5}",
                f"peak RSS {rss:6.1f} MB  {n / seconds:>8,.0f} rows/s{note}",
            )
        )
    big, small = max(sizes), min(sizes)
    for fmt in formats:
        if (big, fmt) in results and (small, fmt) in results and big != small:
            ratio = results[(big, fmt)][0] / results[(small, fmt)][0]
            target = "  (target <= 400 MB)" if big >= 1_000_000 else ""
            lines.append(
                (
                    f"{fmt}: {big:,} vs {small:,}",
                    f"x{ratio:.2f} RSS, {results[(big, fmt)][0]:.0f} MB at {big:,}{target}",
                )
            )
    report("pipeline memory: one shard, trivial in-process processor", lines)


if __name__ == "__main__":
    main()
