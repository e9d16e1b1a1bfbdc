"""Provider batch API: submit 1M small items (build, split, upload) and fetch 1M results.

Targets: submit_batch >= 50,000 items/s with peak RSS <= 400 MB; fetching and decoding
>= 50,000 results/s. Side by side, the floor of submission: writing the same request lines with
bare orjson (no items, no splitting, no upload).
Runs in a child process so that its peak RSS is its own; the emulator runs in another. The
emulator spreads its answering over --provider-seconds (as a real provider works elsewhere), so
that on this 2-core machine it does not take the CPU the measured submission needs.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from _common import peak_rss_mb, report, run_async


def items(n: int):  # type: ignore[no-untyped-def]
    from llm_kit import BatchItem, Message

    return (
        BatchItem(f"item-{i:07d}", [Message.user(f"Summarise row {i} in one line.")])
        for i in range(n)
    )


def floor_write(n: int, path: Path) -> float:
    started = time.perf_counter()
    with open(path, "wb") as f:
        for i in range(n):
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"Summarise row {i} in one line."}],
            }
            f.write(
                orjson.dumps(
                    {
                        "custom_id": str(i),
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": body,
                    },
                    option=orjson.OPT_APPEND_NEWLINE,
                )
            )
    return n / (time.perf_counter() - started)


async def child(base_url: str, fmt: str, n: int, workdir: str) -> None:
    from llm_kit import LLM
    from llm_kit.batch.runner import fetch

    llm = LLM(model="m", message_format=fmt, base_url=base_url, api_key="sk-bench")
    started = time.perf_counter()
    job = await llm.submit_batch(items(n), spool_dir=Path(workdir) / "spool")
    submit_rate = n / (time.perf_counter() - started)
    submit_rss = peak_rss_mb()
    while not (await llm.poll_batch(job)).state.is_terminal:
        await asyncio.sleep(0.5)
    backend = llm._batch_backend()
    started = time.perf_counter()
    ok = 0
    async for result in fetch(backend, job, {}):
        ok += result.ok
    fetch_rate = n / (time.perf_counter() - started)
    await llm.aclose()
    assert ok == n, ok
    floor = floor_write(n, Path(workdir) / "floor.jsonl")
    print(
        orjson.dumps(
            {
                "submit": submit_rate,
                "rss": submit_rss,
                "fetch": fetch_rate,
                "batches": len(job.batches),
                "floor_write": floor,
            }
        ).decode()
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=4, metavar=("BASE_URL", "FORMAT", "N", "DIR"))
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--formats", default="openai,anthropic,gemini")
    parser.add_argument("--provider-seconds", type=float, default=30.0)
    args = parser.parse_args()
    if args.child:
        base_url, fmt, n, workdir = args.child
        run_async(child(base_url, fmt, int(n), workdir))
        return

    from provider_emulator import EmulatorConfig, running_emulator

    rows = []
    config = EmulatorConfig(batch_delay_s=args.provider_seconds)
    with running_emulator(config, subprocess=True) as emu:
        for fmt in args.formats.split(","):
            base = emu.openai_base_url if fmt == "openai" else emu.anthropic_base_url
            with tempfile.TemporaryDirectory() as tmp:
                done = subprocess.run(
                    [sys.executable, __file__, "--child", base, fmt, str(args.items), tmp],
                    capture_output=True,
                    text=True,
                )
            if done.returncode:
                raise SystemExit(done.stderr)
            r = orjson.loads(done.stdout.strip().splitlines()[-1])
            rows += [
                (
                    f"{fmt} submit_batch",
                    f"{r['submit']:,.0f} items/s into {r['batches']} batches, "
                    f"peak RSS {r['rss']:.0f} MB (targets >= 50,000/s, <= 400 MB)",
                ),
                (
                    f"{fmt} bare orjson write",
                    f"{r['floor_write']:,.0f} lines/s "
                    f"(ratio submit/floor {r['submit'] / r['floor_write']:.2f})",
                ),
                (f"{fmt} fetch + decode", f"{r['fetch']:,.0f} results/s (target >= 50,000/s)"),
            ]
    report(f"provider batch API: {args.items:,} items", rows)


if __name__ == "__main__":
    main()
