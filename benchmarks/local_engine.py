"""Throughput of the embedded llama.cpp engine (SmolLM2-135M-Instruct on the CPU).

Run: ``python benchmarks/local_engine.py [--n 20] [--max-tokens 48]``. Prints the load time,
then output tokens/s and requests/s for plain and JSON-schema requests, and how many JSON
answers validated. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from llm_kit.local import LocalEngine

TEXTS = [
    "I love this phone, the battery lasts forever.",
    "The delivery was late and the box was crushed.",
    "The meeting is at 3pm in room 204.",
    "Best concert of my life.",
    "The soup was cold and the waiter was rude.",
    "It works as described.",
    "I would not buy this again.",
    "What a wonderful surprise!",
    "The train leaves at noon.",
    "The screen cracked after one day.",
]


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: float


async def run(
    engine: LocalEngine, n: int, max_tokens: int, schema: dict[str, Any] | None
) -> tuple[float, int, int]:
    """(seconds, output tokens, valid JSON answers) for n concurrent requests."""
    system = "Classify the sentiment of the text as JSON." if schema else "Reply in one sentence."
    calls = [
        engine.complete(
            [
                {"role": "system", "content": system},
                {"role": "user", "content": TEXTS[i % len(TEXTS)]},
            ],
            max_tokens=max_tokens,
            json_schema=schema,
        )
        for i in range(n)
    ]
    start = time.perf_counter()
    results = await asyncio.gather(*calls)
    seconds = time.perf_counter() - start
    valid = 0
    for result in results:
        try:
            Sentiment.model_validate(json.loads(result.text or ""))
            valid += 1
        except (ValueError, ValidationError):
            pass
    return seconds, sum(r.usage.output_tokens for r in results), valid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=20, help="requests per mode")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()

    engine = LocalEngine()
    start = time.perf_counter()
    engine.load()
    print(
        f"model load: {time.perf_counter() - start:.2f} s ({engine.model_path.name}, "
        f"{engine.n_threads} threads)"
    )
    engine.complete_sync([{"role": "user", "content": "hi"}], max_tokens=1)  # warm-up

    for mode, schema in (("plain", None), ("json", Sentiment.model_json_schema())):
        seconds, tokens, valid = asyncio.run(run(engine, args.n, args.max_tokens, schema))
        line = (
            f"{mode:5}: {args.n} requests in {seconds:.2f} s = {args.n / seconds:.2f} req/s, "
            f"{tokens} output tokens = {tokens / seconds:.1f} tok/s"
        )
        if schema is not None:
            line += f", valid JSON {valid}/{args.n}"
        print(line)
    engine.close()


if __name__ == "__main__":
    main()
