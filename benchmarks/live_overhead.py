"""llm_kit's live sinks vs a minimal raw aiohttp worker pool, side by side in one run.

Three pairings, each client in its own process, the raw pool on the same event loop as ours:
``batch_to_jsonl`` on the default loop, ``batch_stream`` on the default loop, ``batch_to_jsonl``
on uvloop (which the ``mmirage`` CLI uses). The server is nginx answering a fixed chat
completion (so that it costs ~nothing), or the emulator when nginx is not installed. Runs
alternate (raw, ours, raw, ours, ...) so that drift on a shared machine hits both alike; the
medians are compared. Target: ours >= 1.0x the raw pool in every pairing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from _common import report, run_child
from _nginx import fixed_answer_server

PAIRINGS = (("jsonl", "asyncio"), ("stream", "asyncio"), ("jsonl", "uvloop"))
TARGET = 1.0


async def raw_pool(base_url: str, n: int, concurrency: int, out: str) -> int:
    """The floor of client overhead: `concurrency` workers over one shared session, orjson both
    ways, one line per answer (a buffered file)."""
    import aiohttp
    import orjson

    url = base_url + "/chat/completions"
    headers = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}
    rows = iter(range(n))
    written = 0
    with open(out, "wb") as sink:

        async def worker(session: aiohttp.ClientSession) -> None:
            nonlocal written
            for i in rows:
                body = orjson.dumps(
                    {"model": "m", "messages": [{"role": "user", "content": f"row {i}"}]}
                )
                async with session.post(url, data=body, headers=headers) as response:
                    answer = orjson.loads(await response.read())
                line = {"id": f"item-{i:07d}", "response": answer["choices"][0]["message"]}
                sink.write(orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE))
                written += 1

        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return written


async def ours(sink: str, base_url: str, n: int, concurrency: int, out: str) -> int:
    from llm_kit import LLM, BatchConfig, BatchItem, Message

    llm = LLM(
        model="m",
        base_url=base_url,
        api_key="sk-bench",
        config=BatchConfig(worker_concurrency=concurrency),
    )
    items = (BatchItem(f"item-{i:07d}", [Message.user(f"row {i}")]) for i in range(n))
    if sink == "jsonl":
        return await llm.batch_to_jsonl(items, out)
    count = 0
    async for result in llm.batch_stream(items):
        count += result.ok
    return count


def child(client: str, loop: str, base_url: str, n: int, concurrency: int, out: str) -> None:
    """One measured run in this process; prints items/s."""
    work = (
        raw_pool(base_url, n, concurrency, out)
        if client == "raw"
        else ours(client, base_url, n, concurrency, out)
    )
    started, cpu_started = time.perf_counter(), time.process_time()
    if loop == "uvloop":
        import uvloop

        done = uvloop.run(work)
    else:
        done = asyncio.run(work)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    assert done == n, f"{client}: {done} of {n} items"
    print(f"{n / elapsed:.1f} {cpu / n * 1e6:.2f}")


class Run(NamedTuple):
    rate: float  # items/s
    cpu_us: float  # CPU time of the client per item: steadier than rates on a busy machine
    rss_mb: float  # the child's peak RSS (wait4)


def measure(client: str, loop: str, base_url: str, n: int, concurrency: int, tmp: str) -> Run:
    out = str(Path(tmp) / f"{client}-{loop}.jsonl")
    Path(out).unlink(missing_ok=True)
    argv = [sys.executable, __file__, "--child", client, loop, base_url, str(n), str(concurrency)]
    stdout, rss = run_child([*argv, out])
    Path(out).unlink(missing_ok=True)
    rate, cpu_us = stdout.split()[-2:]
    return Run(float(rate), float(cpu_us), rss)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairings", default=",".join(f"{s}/{lp}" for s, lp in PAIRINGS))
    parser.add_argument("--child", nargs=6, metavar=("CLIENT", "LOOP", "URL", "N", "C", "OUT"))
    args = parser.parse_args()
    if args.child:
        client, loop, url, n, concurrency, out = args.child
        child(client, loop, url, int(n), int(concurrency), out)
        return
    pairings = [tuple(p.split("/")) for p in args.pairings.split(",")]
    rows: list[tuple[str, str]] = []
    with fixed_answer_server() as (base_url, server), tempfile.TemporaryDirectory() as tmp:
        measure("raw", "asyncio", base_url, 5_000, args.concurrency, tmp)  # warm-up
        for sink, loop in pairings:
            raw_runs: list[Run] = []
            our_runs: list[Run] = []
            for _ in range(args.rounds):
                raw_runs.append(measure("raw", loop, base_url, args.items, args.concurrency, tmp))
                our_runs.append(measure(sink, loop, base_url, args.items, args.concurrency, tmp))
            raw = statistics.median(r.rate for r in raw_runs)
            mine = statistics.median(r.rate for r in our_runs)
            raw_cpu = statistics.median(r.cpu_us for r in raw_runs)
            our_cpu = statistics.median(r.cpu_us for r in our_runs)
            name = f"batch_{sink if sink == 'stream' else 'to_jsonl'} on {loop}"
            rows += [
                (
                    f"{name}: raw pool",
                    f"{raw:7,.0f} items/s {raw_cpu:5.1f} µs CPU/item  ({_runs(raw_runs)})",
                ),
                (
                    f"{name}: llm_kit",
                    f"{mine:7,.0f} items/s {our_cpu:5.1f} µs CPU/item  "
                    f"({_runs(our_runs)}; peak RSS {max(r.rss_mb for r in our_runs):.1f} MB)",
                ),
                (
                    f"{name}: ratio",
                    f"{mine / raw:.3f}  (target >= {TARGET}; CPU per item "
                    f"raw/ours {raw_cpu / our_cpu:.3f})",
                ),
            ]
            print(
                f"  {name}: ratio {mine / raw:.3f}, CPU raw/ours {raw_cpu / our_cpu:.3f}",
                flush=True,
            )
    report(
        f"live overhead: {args.items:,} items, concurrency {args.concurrency}, "
        f"{args.rounds} alternating rounds, server: {server}",
        rows,
    )


def _runs(runs: list[Run]) -> str:
    return "runs: " + ", ".join(f"{r.rate:,.0f}" for r in runs)


if __name__ == "__main__":
    main()
