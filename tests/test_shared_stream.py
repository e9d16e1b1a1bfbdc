"""One request pool for the groups an ``llm`` processor has in flight (``SharedStream``),
against a real HTTP server on 127.0.0.1 that counts the requests it holds at once."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from llm_kit import LLM, BatchConfig, BatchItem, BatchResult, Message
from llm_kit.errors import ProviderError
from mmirage.config.processing_params import LLMOutput
from mmirage.config.processors import LLMProcessorConfig
from mmirage.config.validation import build
from mmirage.core.process.base import OutputRequest
from mmirage.core.process.llm_processor import LLMProcessor
from mmirage.core.process.shared_stream import GROUP, SharedStream

CONCURRENCY = 4


class CountingServer:
    """An OpenAI-compatible chat endpoint that answers after ``delay`` seconds, echoing the
    prompt, and remembers the most requests it held at once."""

    def __init__(self, delay: float = 0.02, status: int = 200) -> None:
        self.delay, self.status = delay, status
        self.active = self.peak = self.served = 0

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.active -= 1
        self.served += 1
        if self.status != 200:
            error = {"message": "bad key", "type": "invalid_request_error"}
            return web.json_response({"error": error}, status=self.status)
        text = body["messages"][-1]["content"]
        return web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": f"echo:{text}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


async def serve(server: CountingServer) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server.chat)
    runner = web.AppRunner(app, handler_cancellation=True)  # a client that hangs up ends it
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/v1"


def client(base_url: str) -> LLM:
    config = BatchConfig(worker_concurrency=CONCURRENCY, max_retries=0)
    llm = LLM(model="m", base_url=base_url, api_key="sk-test", config=config)
    llm.keep_open()
    return llm


def items(prefix: str, n: int) -> list[BatchItem]:
    return [BatchItem(f"{prefix}{i}", [Message.user(f"{prefix}{i}")]) for i in range(n)]


async def collect(stream: SharedStream, batch: list[BatchItem]) -> list[str]:
    got: list[str] = []
    await stream.run(batch, lambda result: got.append(result.id))
    return got


class Stop(Exception):
    """What a caller's ``take`` raises to end its group (a failed journal write does)."""


async def with_server(server: CountingServer) -> tuple[web.AppRunner, LLM, SharedStream]:
    runner, url = await serve(server)
    llm = client(url)
    return runner, llm, SharedStream(llm)


def test_groups_in_flight_share_one_pool_and_get_their_own_results() -> None:
    async def main() -> None:
        server = CountingServer()
        runner, llm, stream = await with_server(server)
        try:
            a, b = items("a", 20), items("b", 20)
            got_a, got_b = await asyncio.gather(collect(stream, a), collect(stream, b))
            await stream.stop()
        finally:
            await llm.aclose()
            await runner.cleanup()
        assert sorted(got_a) == sorted(i.id for i in a)
        assert sorted(got_b) == sorted(i.id for i in b)
        # Two groups, one pool of worker_concurrency requests, all of it used.
        assert server.peak == CONCURRENCY
        assert all(GROUP in i.metadata for i in a + b)

    asyncio.run(main())


def test_a_rejected_key_is_raised_to_every_group_waiting() -> None:
    async def main() -> None:
        server = CountingServer(status=401)
        runner, llm, stream = await with_server(server)
        try:
            outcomes = await asyncio.gather(
                collect(stream, items("a", 6)),
                collect(stream, items("b", 6)),
                return_exceptions=True,
            )
            with pytest.raises(ProviderError, match="rejected"):
                await stream.stop()
        finally:
            await llm.aclose()
            await runner.cleanup()
        assert all(isinstance(o, ProviderError) and o.status == 401 for o in outcomes), outcomes

    asyncio.run(main())


async def cancelled_early(stream: SharedStream, batch: list[BatchItem]) -> None:
    """The caller is cancelled once its first requests are out."""
    waiting = asyncio.create_task(collect(stream, batch))
    await asyncio.sleep(0.06)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


@pytest.mark.parametrize("stop", ["take-fails", "cancelled"])
def test_a_group_that_stops_early_sends_no_more_of_its_requests(stop: str) -> None:
    """A caller that stops is a run that fails: what it has not sent yet is not paid."""

    async def main() -> None:
        server = CountingServer(delay=0.05)
        runner, llm, stream = await with_server(server)
        try:
            stopping = first_result_only if stop == "take-fails" else cancelled_early
            await stopping(stream, items("a", 40))
            await asyncio.sleep(0.3)  # what was in flight has ended
        finally:
            await llm.aclose()
            await runner.cleanup()
        assert server.served < 2 * CONCURRENCY

    asyncio.run(main())


async def first_result_only(stream: SharedStream, batch: list[BatchItem]) -> None:
    """The first result's ``take`` fails: the caller hears that error, not another one."""

    def take(result: BatchResult) -> None:
        raise Stop(result.id)

    with pytest.raises(Stop):
        await stream.run(batch, take)


@pytest.mark.parametrize("at_once", [True, False], ids=["while-another-waits", "then-another"])
def test_a_group_that_stops_early_leaves_another_group_whole(at_once: bool) -> None:
    """Stopping early drops only that group's own requests: one waiting keeps the pool; one
    that comes after gets a new one."""

    async def main() -> list[str]:
        server = CountingServer()
        runner, llm, stream = await with_server(server)
        try:
            if at_once:
                got, _ = await asyncio.gather(
                    collect(stream, items("b", 12)), first_result_only(stream, items("a", 12))
                )
            else:
                await first_result_only(stream, items("a", 12))
                got = await collect(stream, items("b", 12))
            await stream.stop()
            return got
        finally:
            await llm.aclose()
            await runner.cleanup()

    assert sorted(asyncio.run(main())) == sorted(f"b{i}" for i in range(12))


def test_after_stop_or_on_a_new_event_loop_a_new_pool_starts() -> None:
    server = CountingServer(delay=0.0)
    shared: dict[str, SharedStream] = {}

    async def run_once(n: int) -> list[str]:
        runner, url = await serve(server)
        llm = client(url)
        stream = shared.setdefault("stream", SharedStream(llm))
        stream.llm = llm  # this loop's client: a client's connections belong to one loop
        try:
            got = await collect(stream, items(f"r{n}-", 5))
            if n == 0:
                return got  # no stop(): the pool of a loop that ends is left behind
            await stream.stop()
            return got + await collect(stream, items(f"s{n}-", 3))
        finally:
            await stream.cancel()
            await llm.aclose()
            await runner.cleanup()

    assert len(asyncio.run(run_once(0))) == 5
    assert len(asyncio.run(run_once(1))) == 8


def test_cancel_abandons_requests_in_flight() -> None:
    async def main() -> None:
        server = CountingServer(delay=5.0)
        runner, llm, stream = await with_server(server)
        try:
            waiting = asyncio.create_task(collect(stream, items("a", 3)))
            while server.active < 3:
                await asyncio.sleep(0.01)
            await asyncio.wait_for(stream.cancel(), timeout=2)
            with pytest.raises(RuntimeError, match="pool ended"):
                await asyncio.wait_for(waiting, timeout=2)
        finally:
            await llm.aclose()
            await runner.cleanup()
        assert server.served == 0

    asyncio.run(main())


def test_drain_sends_nothing_more_and_returns_once_the_requests_in_flight_are_back() -> None:
    """A shard at its time limit: what is in flight was paid for and comes back to its group;
    the rest is never sent."""

    async def main() -> None:
        server = CountingServer(delay=0.3)
        runner, llm, stream = await with_server(server)
        got: list[str] = []
        try:
            waiting = [
                asyncio.create_task(stream.run(items(p, 6), lambda r: got.append(r.id)))
                for p in ("a", "b")
            ]
            while server.active < CONCURRENCY:
                await asyncio.sleep(0.01)
            await asyncio.wait_for(stream.drain(), timeout=5)
            sent = server.served
            assert len(got) == sent and server.active == 0  # all came back, to their group
            await asyncio.sleep(0.5)
            assert server.served == sent < 12  # nothing more was sent
            assert not any(task.done() for task in waiting)  # their other rows never ran
            await stream.drain()  # nothing in flight: at once
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
        finally:
            await stream.cancel()
            await llm.aclose()
            await runner.cleanup()

    asyncio.run(main())


def test_drain_without_a_pool_returns_at_once() -> None:
    async def main() -> None:
        stream = SharedStream(LLM(model="m", base_url="http://127.0.0.1:9/v1", api_key="k"))
        await asyncio.wait_for(stream.drain(), timeout=1)

    asyncio.run(main())


def test_an_llm_processor_holds_worker_concurrency_requests_over_two_groups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the shard runner does: two groups in flight through one processor."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")

    async def main() -> None:
        server = CountingServer()
        runner, url = await serve(server)
        raw = {"type": "llm", "base_url": url, "model": "m", "worker_concurrency": CONCURRENCY}
        processor = LLMProcessor(build(LLMProcessorConfig, raw, ("processors", 0), "t.yaml"))
        output = LLMOutput(name="answer", prompt="{{ text }}")
        try:
            first, second = await asyncio.gather(
                processor.process(output, requests("a", 16)),
                processor.process(output, requests("b", 16)),
            )
            assert await processor.finish() is None
            third = await processor.process(output, requests("c", 3))  # a new pool
        finally:
            await processor.aclose()
            await runner.cleanup()
        assert [r.value for r in first] == [f"echo:a{i}" for i in range(16)]
        assert [r.value for r in second] == [f"echo:b{i}" for i in range(16)]
        assert [r.value for r in third] == [f"echo:c{i}" for i in range(3)]
        assert server.peak == CONCURRENCY

    asyncio.run(main())


def requests(prefix: str, n: int) -> list[OutputRequest]:
    return [OutputRequest(f"0::{prefix}{i}", "answer", f"{prefix}{i}") for i in range(n)]
