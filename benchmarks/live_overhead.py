"""batch_to_jsonl vs a minimal raw aiohttp worker pool, same emulator, concurrency 256.

Target: ours >= 85 % of the raw pool's items/s. Runs alternate (raw, ours, raw, ours, ...) so
that drift on this shared machine hits both sides alike; the medians are compared.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

from _common import report, run_async
from llm_kit import LLM, BatchConfig, BatchItem, Message
from llm_kit.emulator import EmulatorConfig, running_emulator


async def raw_pool(base_url: str, n: int, concurrency: int) -> float:
    """The floor of client overhead: N posts, `concurrency` workers, one shared session."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
    url = base_url + "/chat/completions"

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            body = orjson.dumps(
                {"model": "m", "messages": [{"role": "user", "content": f"row {i}"}]}
            )
            async with session.post(url, data=body, headers=headers) as response:
                orjson.loads(await response.read())

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        return n / (time.perf_counter() - started)


async def ours(base_url: str, n: int, concurrency: int, out: Path) -> float:
    out.unlink(missing_ok=True)
    llm = LLM(
        model="m",
        base_url=base_url,
        api_key="sk-bench",
        config=BatchConfig(worker_concurrency=concurrency),
    )
    items = (BatchItem(f"item-{i:07d}", [Message.user(f"row {i}")]) for i in range(n))
    started = time.perf_counter()
    written = await llm.batch_to_jsonl(items, out)
    elapsed = time.perf_counter() - started
    await llm.aclose()
    assert written == n
    return n / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--emulator-workers", type=int, default=1)
    args = parser.parse_args()
    config = EmulatorConfig(workers=args.emulator_workers)
    with running_emulator(config, subprocess=True) as emu, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.jsonl"
        await raw_pool(emu.openai_base_url, 2000, args.concurrency)  # warm-up
        raw_runs, our_runs = [], []
        for _ in range(args.rounds):
            raw_runs.append(await raw_pool(emu.openai_base_url, args.items, args.concurrency))
            our_runs.append(await ours(emu.openai_base_url, args.items, args.concurrency, out))
    raw, mine = sorted(raw_runs)[len(raw_runs) // 2], sorted(our_runs)[len(our_runs) // 2]
    report(
        f"live overhead: {args.items:,} items, concurrency {args.concurrency}, "
        f"emulator workers {args.emulator_workers}",
        [
            (
                "raw aiohttp pool",
                f"{raw:,.0f} items/s  (runs: {', '.join(f'{r:,.0f}' for r in raw_runs)})",
            ),
            (
                "llm_kit batch_to_jsonl",
                f"{mine:,.0f} items/s  (runs: {', '.join(f'{r:,.0f}' for r in our_runs)})",
            ),
            ("ratio ours/raw", f"{mine / raw:.2f}  (target >= 0.85)"),
        ],
    )


if __name__ == "__main__":
    run_async(main())
