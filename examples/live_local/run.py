"""The embedded default: label and rewrite a dozen prompts with the local CPU model.

No API key, no GPU, no network. Run with `make demo`. Results stream to
out/live_local.jsonl; run it again and it resumes (already-finished ids are skipped).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from llm_kit import LLM, BatchConfig, BatchItem, Message

HERE = Path(__file__).parent
OUTPUT = Path("out/live_local.jsonl")


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]


def load_items() -> list[BatchItem]:
    items = []
    for line in (HERE / "prompts.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["task"] == "sentiment":
            messages = [
                Message.user(f"Is this review positive, negative or neutral?\n{row['text']}")
            ]
            items.append(BatchItem(row["id"], messages, response_model=Sentiment))
        else:
            messages = [
                Message.system("You rewrite sentences in simpler words. Answer with one sentence."),
                Message.user(row["text"]),
            ]
            items.append(BatchItem(row["id"], messages, metadata={"source": row["text"]}))
    return items


async def main() -> int:
    llm = LLM(
        model="SmolLM2-135M-Instruct",
        message_format="local",
        temperature=0.0,
        max_tokens=48,
        config=BatchConfig(worker_concurrency=2),
    )
    items = load_items()
    started = time.perf_counter()
    written = await llm.batch_to_jsonl(items, OUTPUT, resume=True, progress=sys.stderr.isatty())
    elapsed = time.perf_counter() - started
    records = [json.loads(line) for line in OUTPUT.read_text().splitlines()]
    ok = sum(r["ok"] for r in records)
    print(f"{written} new results in {elapsed:.1f} s; {OUTPUT} holds {len(records)} ({ok} ok)")
    for record in sorted(records, key=lambda r: r["id"])[::6][:2]:
        print(json.dumps({k: record[k] for k in ("id", "ok", "response", "usage")}))
    return 0 if ok == len(records) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
