"""Pacing against an emulator that enforces 600 RPM with real 429s and headers.

Targets: no 60 s window holds more than 600 x 1.02 admitted requests, and <= 1 % of requests get
a 429. For contrast the same load runs first with a client that knows no limit and learns it only
from the headers and the 429s, then with `BatchConfig(rpm=600)`.
"""

from __future__ import annotations

import argparse
import bisect
import time
from typing import Any

from _common import report, run_async
from llm_kit import LLM, BatchConfig, BatchItem, Message
from provider_emulator import EmulatorConfig, running_emulator

RPM = 600


def worst_window(times: list[float], width: float = 60.0) -> int:
    times = sorted(times)
    return max((bisect.bisect_right(times, t + width) - i for i, t in enumerate(times)), default=0)


async def run(n: int, rpm: int | None) -> dict[str, Any]:
    with running_emulator(EmulatorConfig(rpm=RPM, record_times=True), subprocess=True) as emu:
        llm = LLM(
            model="m",
            base_url=emu.openai_base_url,
            api_key="sk-bench",
            config=BatchConfig(worker_concurrency=64, rpm=rpm, max_retries=50),
        )
        items = (BatchItem(str(i), [Message.user(f"row {i}")]) for i in range(n))
        started = time.perf_counter()
        results = [r async for r in llm.batch_stream(items)]
        elapsed = time.perf_counter() - started
        await llm.aclose()
        stats = emu.stats()
    refused = stats["status"].get("429", 0)
    return {
        "ok": sum(r.ok for r in results),
        "elapsed": elapsed,
        "worst": worst_window(stats["times"]),
        "refused": refused,
        "requests": stats["requests"],
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=1500, help="1500 at 600 RPM is ~150 s")
    args = parser.parse_args()
    rows = []
    for label, rpm in (("learned from headers", None), ("BatchConfig(rpm=600)", RPM)):
        r = await run(args.items, rpm)
        rows.append(
            (
                label,
                f"{r['ok']}/{args.items} ok in {r['elapsed']:.0f} s; worst 60 s window "
                f"{r['worst']} admitted ({r['worst'] / RPM - 1:+.1%} vs limit); "
                f"429s {r['refused']}/{r['requests']} ({r['refused'] / max(1, r['requests']):.2%})",
            )
        )
    rows.append(("targets", "window <= +2 %, 429s <= 1 %"))
    report(f"pacing at {RPM} RPM, {args.items} items, concurrency 64", rows)


if __name__ == "__main__":
    run_async(main())
