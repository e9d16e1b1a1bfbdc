"""Run by test_crash_resume.py in a subprocess that gets killed with SIGKILL at random moments."""

from __future__ import annotations

import asyncio
import sys

from llm_kit import LLM, BatchConfig, BatchItem, Message


async def main(base_url: str, out: str, total: int) -> None:
    llm = LLM(
        model="m",
        base_url=base_url,
        api_key="sk-crash-test",
        config=BatchConfig(worker_concurrency=64),
    )
    items = (
        BatchItem(f"id-{i:05d}", [Message.user(f"row {i}")], metadata={"i": i})
        for i in range(total)
    )
    written = await llm.batch_to_jsonl(items, out, resume=True)
    await llm.aclose()
    print(written)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
