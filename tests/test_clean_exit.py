"""The llm_kit "Batching" spec page's code, run as written (it never closes the client), exits
without a warning: each call closes the connections it opened. ``async with LLM(...)`` and
``aclose()`` work too, and connections are still reused within a call."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_KEY
from llm_kit import LLM, BatchConfig, BatchItem, Message
from llm_kit.transport import HttpTransport

# The spec page's blocks, verbatim but for the item count (a million requests is a benchmark,
# not a test).
SPEC_ITEMS = """
from llm_kit import BatchItem, Message

items = [
    BatchItem(
        id=f"item-{i:06d}",
        messages=[Message.user(f"Caption:", image_urls=["https://..."])],
        response_model=Sentiment,    # per-item schemas are supported
    )
    for i in range(1_000_000)
]
""".replace("1_000_000", "40")

SPEC_SINKS = """
# (1) async iterator — yields results as they complete
async for result in llm.batch_stream(items):
    if result.ok:
        do_something_with(result.response)
    else:
        log_error(result.error)

# (2) stream to JSONL, resumable on crash
written = await llm.batch_to_jsonl(items, "out.jsonl", resume=True)

# (3) per-result callback (sync or async)
await llm.batch_to_callback(items, lambda r: save(r))
"""

SPEC_BATCH_API = """
from llm_kit import BatchJob

# One-shot: submit, poll to completion, write reconciled results to jsonl.
written = await llm.run_batch_api(items, "out.jsonl", poll_interval=60)

# Or split across processes — the BatchJob handle is the checkpoint:
job = await llm.submit_batch(items)         # serialize + upload + create
job.save("job.json")                        # persist the handle (batch_id + manifest)

# ...later, in a fresh process...
job = BatchJob.load("job.json")
status = await llm.poll_batch(job)          # BatchJobStatus(state=..., counts=...)
if status.state.is_terminal:
    async for result in llm.fetch_batch_results(job, items=items):
        ...
"""

# What the page leaves to the reader: a client (aimed at the emulator) and the helpers.
PRELUDE = """
import asyncio
import os
from typing import Literal

from pydantic import BaseModel

from llm_kit import LLM


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: float


llm = LLM(model="gpt-4o-mini", base_url=os.environ["SPEC_BASE_URL"], api_key=os.environ["KEY"])
seen = []


def do_something_with(response):
    seen.append(response)


def log_error(error):
    raise SystemExit(f"an item failed: {error}")


def save(result):
    seen.append(result)
"""


def spec_script(*blocks: str, wrap: str | None = None) -> str:
    """The blocks as the body of ``async def main()``, run by ``asyncio.run``; ``wrap`` is a
    line the body is nested under (``async with llm:``)."""
    body = "\n".join(textwrap.dedent(block) for block in blocks)
    if wrap:
        body = wrap + "\n" + textwrap.indent(body, "    ")
    main = "async def main():\n" + textwrap.indent(body, "    ") + "\n    print('done')\n"
    return PRELUDE + "\n\n" + main + "\n\nasyncio.run(main())\n"


def run_script(tmp_path: Path, source: str, base_url: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "spec_example.py"
    script.write_text(source)
    # os.environ keeps PYTHONPATH: the script must import this checkout's llm_kit.
    env = {**os.environ, "SPEC_BASE_URL": base_url, "KEY": TEST_KEY}
    return subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "blocks",
    [(SPEC_ITEMS, SPEC_SINKS), (SPEC_ITEMS, SPEC_BATCH_API)],
    ids=["live-sinks", "batch-api"],
)
def test_spec_blocks_as_written_exit_without_a_warning(
    tmp_path: Path, emulator: Any, blocks: tuple[str, ...]
) -> None:
    done = run_script(tmp_path, spec_script(*blocks), emulator.openai_base_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert done.stderr == ""  # no "Unclosed client session", no "Unclosed connector"
    assert (tmp_path / "out.jsonl").read_text().count("\n") == 40


@pytest.mark.parametrize(
    ("wrap", "tail"),
    [("async with llm:", ""), (None, "await llm.aclose()")],
    ids=["async-with", "aclose"],
)
def test_closing_the_client_explicitly_also_exits_cleanly(
    tmp_path: Path, emulator: Any, wrap: str | None, tail: str
) -> None:
    source = spec_script(SPEC_ITEMS, SPEC_SINKS, tail, wrap=wrap)
    done = run_script(tmp_path, source, emulator.openai_base_url)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def count_sessions(monkeypatch: pytest.MonkeyPatch) -> list[HttpTransport]:
    opened: list[HttpTransport] = []
    real_open = HttpTransport._open

    def counting_open(self: HttpTransport) -> Any:
        opened.append(self)
        return real_open(self)

    monkeypatch.setattr(HttpTransport, "_open", counting_open)
    return opened


def items(n: int) -> list[BatchItem]:
    return [BatchItem(id=f"i{i}", messages=[Message.user(f"hello {i}")]) for i in range(n)]


async def test_one_call_shares_one_pool_and_closes_it(
    emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = count_sessions(monkeypatch)
    llm = LLM(
        "m", base_url=emulator.openai_base_url, api_key=TEST_KEY,
        config=BatchConfig(worker_concurrency=8),
    )  # fmt: skip
    assert await llm.batch_to_callback(items(200), lambda r: None) == 200
    assert len(opened) == 1  # 200 requests, one connection pool
    assert opened[0]._session is None  # closed when the call ended
    await llm.complete("again")
    assert len(opened) == 2 and opened[1]._session is None


async def test_async_with_keeps_the_pool_across_calls(
    emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = count_sessions(monkeypatch)
    async with LLM("m", base_url=emulator.openai_base_url, api_key=TEST_KEY) as llm:
        await llm.batch_to_callback(items(20), lambda r: None)
        await llm.complete("again")
        assert len(opened) == 1 and opened[0]._session is not None
    assert opened[0]._session is None


async def test_a_consumer_that_stops_early_closes_the_pool(
    emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = count_sessions(monkeypatch)
    llm = LLM("m", base_url=emulator.openai_base_url, api_key=TEST_KEY)
    stream = llm.batch_stream(items(50))
    async for _ in stream:
        break
    await stream.aclose()  # what `async for` leaves to the event loop's generator cleanup
    assert len(opened) == 1 and opened[0]._session is None
