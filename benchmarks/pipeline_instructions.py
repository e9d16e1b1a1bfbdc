"""What a row costs in instructions: `mmirage run` (one `llm` output, JSONL shard) against
llm_kit's `batch_to_jsonl`, counted by valgrind over a canned transport (no network).

pipeline_overhead.py holds the targets, in wall time, and wall time moves with the host by more
than the differences worth steering by. Instruction counts do not: the transport answers every
request with the same chat completion at once, hash randomization is fixed and the bytecode is
cached first, so a run executes the same instructions to about 0.1 %. Each side runs on 1 row
(its start-up) and on N rows; the difference over N - 1 rows is its cost per row, HTTP left
out. What mmirage adds is the difference of the two sides: the figures to steer by when the
pipeline's own overhead is worked on (a row's HTTP costs both sides the same ~370k more).

A second pass runs both sides on N rows against the emulator (its own process, real HTTP): the
ratio of their counts is what pipeline_overhead.py's wall ratio measures (the client is
CPU-bound there: its wall time is its CPU time), without the host's noise (a round there moves
by +-15 %, this count by ~0.5 %: how answers bunch into loop turns varies). Only the client's
own instructions count (the kernel's side of each socket call is left out, about the same for
both); the HF helper process is left out too, so this is the JSONL shard's figure.

One count runs high: mmirage hashes its published shard (SHA-256), and valgrind's CPU has no
SHA instructions, so the hash takes 28 instructions a byte there (5.9k a row, measured by
leaving it out) against ~1.5 cycles a byte on this host (0.09 us a row): the counted ratio is
about 0.01 below the one a real CPU runs. The kernel's side of mmirage's extra file writes
and page faults, which the count leaves out, goes the other way.

Needs valgrind (Debian: `apt-get install valgrind`); a minute or two.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import report, run_async

HERE = Path(__file__).resolve()
BASE_URL = "http://127.0.0.1:9/v1"  # never reached: the transport is canned
ENV = {
    **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
    "PYTHONHASHSEED": "0",
    "OPENAI_API_KEY": "sk-bench",
}


def can_transport() -> None:
    """Every POST answers a chat completion echoing the last message, after one loop turn."""
    import orjson

    from llm_kit.transport import HttpTransport

    headers = {"content-type": "application/json"}

    async def post_json(self: Any, path: str, body: Any) -> tuple[int, Any, bytes]:
        await asyncio.sleep(0)
        text = "echo: " + body["messages"][-1]["content"]
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        usage = {"prompt_tokens": 8, "completion_tokens": 9, "total_tokens": 17}
        answer = {"id": "x", "model": body["model"], "choices": [choice], "usage": usage}
        return 200, headers, orjson.dumps({**answer, "object": "chat.completion"})

    HttpTransport.post_json = post_json  # type: ignore[method-assign]


def child(transport: str, side: str, args: list[str]) -> None:
    if transport == "canned":
        can_transport()
    if side == "mmirage":
        from mmirage.cli import entry  # the mmirage program, its exit included

        sys.argv = ["mmirage", "run", args[0], "--fresh"]
        entry()
    else:
        from pipeline_overhead import batch_child

        base_url, n, out = args
        Path(out).unlink(missing_ok=True)
        run_async(batch_child(base_url, int(n), out, 64))


def instructions(transport: str, side: str, args: list[str]) -> int:
    command = [sys.executable, str(HERE), "--child", transport, side, *args]
    subprocess.run(command, env=ENV, check=True, capture_output=True)  # bytecode cached
    valgrind = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
    ]
    done = subprocess.run([*valgrind, *command], env=ENV, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{side} failed under valgrind: {done.stderr[-2000:]}")
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    assert found, done.stderr[-2000:]
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs="+", metavar="ARG")
    parser.add_argument("--rows", type=int, default=20_000)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.child[2:])
        return
    if shutil.which("valgrind") is None:
        print("\n== pipeline instructions: skipped (needs valgrind: apt-get install valgrind)")
        return
    from pipeline_overhead import TARGETS, write_config, write_data
    from provider_emulator import EmulatorConfig, running_emulator

    n = args.rows
    counts: dict[tuple[str, int], int] = {}
    http: dict[str, int]  # side -> instructions on n rows against the emulator

    def count_both(transport: str, base_url: str, tmp: Path, rows: int) -> dict[str, int]:
        data = tmp / f"rows{rows}.jsonl"
        write_data(data, rows)
        config = write_config(tmp, f"{transport}{rows}", data, base_url, 64, "jsonl")
        batch_args = [base_url, str(rows), str(tmp / "out.jsonl")]
        return {
            "mmirage": instructions(transport, "mmirage", [str(config)]),
            "batch": instructions(transport, "batch", batch_args),
        }

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for rows in (1, n):
            for side, count in count_both("canned", BASE_URL, tmp, rows).items():
                counts[side, rows] = count
        with running_emulator(EmulatorConfig(), subprocess=True) as emu:
            http = count_both("http", emu.openai_base_url, tmp, n)

    def start(side: str) -> float:
        return counts[side, 1] / 1e9

    def per_row(side: str) -> float:
        return (counts[side, n] - counts[side, 1]) / (n - 1) / 1e3

    def with_http(side: str) -> float:
        return (http[side] - counts[side, 1]) / (n - 1) / 1e3

    rows = [
        (
            side,
            f"start-up {start(side):.3f} G   per row {per_row(side):6.1f} k"
            f"   per row with HTTP {with_http(side):6.1f} k",
        )
        for side in ("batch", "mmirage")
    ]
    report(f"pipeline instructions: {n:,} rows, canned transport, then HTTP to the emulator", rows)
    print(
        f"mmirage adds {start('mmirage') - start('batch'):.3f} G at start-up and "
        f"{per_row('mmirage') - per_row('batch'):.1f} k a row; "
        f"at {n:,} rows: batch/mmirage {counts['batch', n] / counts['mmirage', n]:.3f}"
    )
    ratio = http["batch"] / http["mmirage"]
    print(
        f"with HTTP to the emulator, {n:,} rows: batch/mmirage {ratio:.3f} (the whole process: "
        f"what pipeline_overhead.py's jsonl wall ratio measures, target >= {TARGETS['jsonl']:.2f}, "
        "counted)"
    )


if __name__ == "__main__":
    main()
