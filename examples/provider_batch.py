"""The provider batch API, end to end: submit, save the handle, poll, fetch, resubmit.

By default it rehearses against the built-in emulator (no key, no network):

    .venv/bin/python examples/provider_batch.py [openai|anthropic|gemini]

Against a real provider, set the key (OPENAI_API_KEY, ANTHROPIC_API_KEY or GEMINI_API_KEY) and
pass --real; the job then takes minutes to hours, and the handle in out/job.json lets you stop
and come back: `mmirage job status out/job.json`, `mmirage job fetch out/job.json -o out.jsonl`.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from llm_kit import LLM, BatchItem, BatchJob, Message
from provider_emulator import EmulatorConfig, running_emulator

OUT = Path("out")
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]


def make_items() -> list[BatchItem]:
    reviews = ["Love it.", "Broke in a day.", "It is a chair.", "Great value!", "Never again."]
    return [
        BatchItem(
            id=f"review-{i:03d}",
            messages=[Message.user(f"Sentiment of this review: {text}")],
            response_model=Sentiment,
            metadata={"text": text},
        )
        for i, text in enumerate(reviews * 4)
    ]


@contextlib.contextmanager
def provider(fmt: str, real: bool) -> Iterator[str | None]:
    if real:
        yield None
        return
    # A little delay and a few per-item errors, to show polling and resubmission at work.
    with running_emulator(EmulatorConfig(batch_delay_s=1.0, batch_item_error_rate=0.2)) as emu:
        yield emu.openai_base_url if fmt == "openai" else emu.anthropic_base_url


async def main(fmt: str, real: bool) -> None:
    OUT.mkdir(exist_ok=True)
    items = make_items()
    with provider(fmt, real) as base_url:
        key = None if real else "emulator-key"
        llm = LLM(model=MODELS[fmt], message_format=fmt, base_url=base_url, api_key=key)

        job = await llm.submit_batch(items)  # serialise + upload + create
        job.save(OUT / "job.json")  # the handle: batch ids + manifest, never the key
        print(f"submitted {len(job.item_ids)} items as {len(job.batches)} batch(es)")

        job = BatchJob.load(OUT / "job.json")  # ...as a fresh process would
        while not (status := await llm.poll_batch(job)).state.is_terminal:
            print(status)
            await asyncio.sleep(60 if real else 0.3)
        print(status)

        if await llm.resubmit_failed(job):  # only the failed items, as new batches
            while not (status := await llm.poll_batch(job)).state.is_terminal:
                await asyncio.sleep(60 if real else 0.3)
        job.save(OUT / "job.json")

        async for result in llm.fetch_batch_results(job, items=items):
            shown = result.response.label if result.ok else f"error: {result.error}"
            print(f"{result.id}  {result.metadata['text']:<18} {shown}")
        await llm.aclose()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    asyncio.run(main(args[0] if args else "openai", "--real" in sys.argv))
