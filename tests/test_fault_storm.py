"""A storm of 429s, 500s, resets and hangs: every item ends as a success or a recorded error."""

from __future__ import annotations

from pathlib import Path

import orjson

from conftest import TEST_KEY
from llm_kit import LLM, BatchConfig, BatchItem, Message
from provider_emulator import EmulatorConfig, Faults, running_emulator

N = 1500


async def test_fault_storm_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    faults = Faults(
        rate_429=0.20,
        rate_500=0.05,
        rate_reset=0.02,
        rate_hang=0.01,
        retry_after_s=0.05,
        hang_s=30.0,
    )
    out = tmp_path / "out.jsonl"
    with running_emulator(EmulatorConfig(faults=faults, seed=7)) as emu:
        llm = LLM(
            model="m",
            base_url=emu.openai_base_url,
            api_key=TEST_KEY,
            config=BatchConfig(
                worker_concurrency=64,
                max_retries=12,
                retry_base_delay=0.01,
                retry_max_delay=0.2,
                request_timeout=1.0,
            ),
        )
        items = (BatchItem(f"s{i}", [Message.user(f"storm {i}")]) for i in range(N))
        written = await llm.batch_to_jsonl(items, out)
        await llm.aclose()
        stats = emu.stats()
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert written == N == len(records)
    assert len({r["id"] for r in records}) == N
    for record in records:
        assert record["ok"] or (record["error"] and not record["retryable"]), record
    # The storm really happened: the emulator answered with every kind of fault.
    statuses = stats["status"]
    assert statuses.get("429", 0) > 0.1 * N and statuses.get("500", 0) > 0
    assert sum(r["attempts"] for r in records) > N * 1.2
