"""Peak RSS of batch_to_jsonl over a generator: 100k items vs 1M items.

Targets: peak RSS at 1M <= 60 MB and <= 1.15x the peak at 100k (memory does not grow with N).
Each size runs in its own process, whose peak the parent reads from wait4 (ru_maxrss), against
nginx answering a fixed completion (the emulator in its own process when nginx is missing).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import report, run_async, run_child
from _nginx import fixed_answer_server

TARGET_MB = 60.0


async def child(base_url: str, n: int, out: str, concurrency: int) -> None:
    from llm_kit import LLM, BatchConfig, BatchItem, Message

    llm = LLM(
        model="m",
        base_url=base_url,
        api_key="sk-bench",
        config=BatchConfig(worker_concurrency=concurrency, input_buffer_size=1024),
    )
    items = (
        BatchItem(
            f"item-{i:07d}", [Message.user(f"Summarise row {i} in one line.")], metadata={"row": i}
        )
        for i in range(n)
    )
    started = time.perf_counter()
    written = await llm.batch_to_jsonl(items, out)
    elapsed = time.perf_counter() - started
    await llm.aclose()
    assert written == n, written
    print(f"{n / elapsed:.0f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=4, metavar=("BASE_URL", "N", "OUT", "CONCURRENCY"))
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    if args.child:
        base_url, n, out, concurrency = args.child
        run_async(child(base_url, int(n), out, int(concurrency)))
        return

    sizes = [int(s) for s in args.sizes.split(",")]
    peaks: dict[int, tuple[float, float]] = {}
    with fixed_answer_server() as (base_url, server), tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            out = Path(tmp) / f"out-{n}.jsonl"
            argv = [sys.executable, __file__, "--child", base_url, str(n), str(out)]
            stdout, rss = run_child([*argv, str(args.concurrency)])
            peaks[n] = (rss, float(stdout.split()[-1]))
            out.unlink()
    rows = [
        (f"{n:>9,} items", f"peak RSS {rss:6.1f} MB   {rate:,.0f} items/s")
        for n, (rss, rate) in peaks.items()
    ]
    if len(sizes) >= 2:
        small, large = peaks[sizes[0]][0], peaks[sizes[-1]][0]
        rows.append(
            (
                "ratio largest/smallest",
                f"{large / small:.3f}  (target <= 1.15; largest <= {TARGET_MB:g} MB)",
            )
        )
    report(f"live memory: batch_to_jsonl from a generator, server: {server}", rows)


if __name__ == "__main__":
    main()
