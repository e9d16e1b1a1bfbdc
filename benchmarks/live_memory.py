"""Peak RSS of batch_to_jsonl over a generator: 100k items vs 1M items.

Targets: peak RSS at 1M <= 250 MB and <= 1.15x the peak at 100k (memory does not grow with N).
Each size runs in its own process (so each peak is its own), against one emulator process.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import peak_rss_mb, report, run_async


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
    print(f"{peak_rss_mb():.1f} {n / elapsed:.0f}")


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

    from llm_kit.emulator import EmulatorConfig, running_emulator

    sizes = [int(s) for s in args.sizes.split(",")]
    peaks: dict[int, tuple[float, float]] = {}
    with (
        running_emulator(EmulatorConfig(), subprocess=True) as emu,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for n in sizes:
            out = Path(tmp) / f"out-{n}.jsonl"
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    emu.openai_base_url,
                    str(n),
                    str(out),
                    str(args.concurrency),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            rss, rate = done.stdout.split()
            peaks[n] = (float(rss), float(rate))
            out.unlink()
    rows = [
        (f"{n:>9,} items", f"peak RSS {rss:6.1f} MB   {rate:,.0f} items/s")
        for n, (rss, rate) in peaks.items()
    ]
    if len(sizes) >= 2:
        small, large = peaks[sizes[0]][0], peaks[sizes[-1]][0]
        rows.append(
            ("ratio largest/smallest", f"{large / small:.3f}  (target <= 1.15; largest <= 250 MB)")
        )
    report("live memory: batch_to_jsonl from a generator", rows)


if __name__ == "__main__":
    main()
