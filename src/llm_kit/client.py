"""`LLM`: one model behind one wire format, with the live pipeline's three sinks."""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sized
from contextlib import aclosing
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from llm_kit import jsonl
from llm_kit.answers import VALIDATION, failed_result, judge, max_tokens_of, reask
from llm_kit.backends import Backend, HttpBackend
from llm_kit.batch.api import BatchAPI
from llm_kit.breaker import ConnectionBreaker
from llm_kit.delivery import delivered
from llm_kit.dialect_choice import check_structured_output, dialect_choice
from llm_kit.errors import CompletionError, ConfigError, ItemError, KeyRefusedError, ProviderError
from llm_kit.finished_ids import FinishedIds
from llm_kit.interrupts import HeldCtrlC
from llm_kit.keys import NO_KEY, key_for
from llm_kit.pacing import backoff_delay, estimate_tokens
from llm_kit.pipeline import Items, run_pool
from llm_kit.providers import get_codec, provider_spec, require_key
from llm_kit.ratelimit import RateLimiter
from llm_kit.request_stats import RequestStats
from llm_kit.resume_plan import NOTHING_DONE, ResumePlan
from llm_kit.schema import response_schema
from llm_kit.sessions import BackendScope, closes_after, closes_after_stream
from llm_kit.transport import HttpTransport
from llm_kit.types import BatchConfig, BatchItem, BatchResult, Message, Usage


class LLM(BatchAPI):
    """A model you can send one request or a million to.

    ``message_format`` picks the wire format: ``openai`` (also any OpenAI-compatible server
    through ``base_url``), ``anthropic``, ``gemini`` or ``local`` (the embedded CPU model).
    The key comes from ``api_key``, ``api_key_env`` or the provider's variable; it is kept in
    memory only, never written anywhere. ``structured_output`` says how an OpenAI-compatible
    server is asked for a ``response_model``'s JSON (``llm_kit.dialects``; ``auto``: learned
    per model from refusals and first answers). Each call closes the connections it opened;
    ``async with LLM(...)`` or ``keep_open()`` keep them across calls.

    Args:
        model: the model to call (for ``local``, a ``.gguf`` path or any name for the default).
        message_format: the provider: ``openai``, ``anthropic``, ``gemini``, ``local`` or one
            registered in ``llm_kit.providers``.
        base_url: another endpoint than the provider's (an OpenAI-compatible server, a gateway).
        api_key: the key; ``None`` reads ``api_key_env``, else ``OPENAI_API_KEY``... (keys.py).
        api_key_env: the environment variable that holds this endpoint's key.
        temperature: sampling default for every request (as are the four below).
        top_p: nucleus sampling.
        max_tokens: the longest answer, in tokens.
        seed: best-effort deterministic sampling.
        stop: stop sequence(s).
        sampling: more provider-specific sampling fields, sent as given.
        config: concurrency, retries, timeouts and rate limits (``BatchConfig()`` if ``None``).
        headers: extra HTTP headers for every request.
        structured_output: the JSON dialect for a ``response_model`` (OpenAI-compatible only).

    Raises:
        ConfigError: an unknown ``message_format``, an empty ``model``, or no key
            (``MissingAPIKeyError``) for a provider that needs one or in ``api_key_env``.
    """

    def __init__(
        self,
        model: str,
        message_format: str = "openai",
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        api_key_env: str | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
        stop: str | list[str] | None = None,
        sampling: dict[str, Any] | None = None,
        config: BatchConfig | None = None,
        headers: dict[str, str] | None = None,
        structured_output: str = "auto",
    ) -> None:
        spec = provider_spec(message_format)  # an unknown one is an error naming the known
        if not model:
            raise ConfigError("LLM(model=...) is required: name the model to call")
        self.model = model
        self.message_format = message_format
        self.config = config or BatchConfig()
        defaults = {
            "temperature": temperature,
            "top_p": top_p,
            "max_tokens": max_tokens,
            "seed": seed,
            "stop": stop,
        }
        self.sampling: dict[str, Any] = {
            k: v for k, v in {**defaults, **(sampling or {})}.items() if v is not None
        }
        self._extra_headers = dict(headers or {})
        self.structured_output = check_structured_output(structured_output, message_format)
        self.limiter = RateLimiter(self.config.rpm, self.config.tpm)
        self.breaker = ConnectionBreaker()  # stops sending to an endpoint that never answers
        self.stats = RequestStats(model)  # retries by cause, tokens: for progress reports
        self._scope = BackendScope(self._make_backend)
        self._open_in_process = spec.in_process(model, self.config) if spec.in_process else None
        in_process = self._open_in_process is not None
        self.base_url = None if in_process else base_url or spec.default_base_url
        self._key = NO_KEY if in_process else key_for(spec, api_key, api_key_env, base_url)

    def __repr__(self) -> str:  # never shows the key
        return f"LLM(model={self.model!r}, message_format={self.message_format!r})"

    # -- lifecycle ------------------------------------------------------------------------

    def _get_backend(self) -> Backend:
        return self._scope.get()

    def _make_backend(self) -> Backend:
        if self._open_in_process is not None:
            return self._open_in_process()
        codec = get_codec(self.message_format).answering_at(self.base_url)
        auth = codec.auth_headers(self._key.value) if self._key.value else {}
        transport = HttpTransport(
            self.base_url or codec.default_base_url,
            {**auth, **self._extra_headers},
            max_connections=self.config.worker_concurrency,
            request_timeout=self.config.request_timeout,
            connect_timeout=self.config.connect_timeout,
        )
        structured = (
            dialect_choice(transport.base_url, self.model, self.structured_output)
            if codec.speaks_dialects
            else None
        )
        return HttpBackend(codec, self.model, transport, self.limiter, structured, self._key)

    def keep_open(self) -> None:
        """Keep the connections open across calls until ``aclose()`` (each call otherwise
        closes what it opened when it ends)."""
        self._scope.hold()

    async def aclose(self) -> None:
        """Close the connections held open by ``keep_open()``."""
        await self._scope.close()

    async def __aenter__(self) -> LLM:
        self._scope.hold()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._scope.release()

    def request_stats(self) -> RequestStats:
        """What this client's requests came to so far: retries by cause, seconds the pool
        spent cooling down after rate limits, tokens used (live counters, not a copy)."""
        self.stats.cooldown_seconds = self.limiter.cooled_down_seconds
        return self.stats

    # -- one request ------------------------------------------------------------------------

    async def complete(
        self,
        messages: str | list[Message] | list[dict[str, Any]],
        *,
        response_model: type[BaseModel] | None = None,
        **sampling: Any,
    ) -> Any:
        """One request with retries: the text, or the validated ``response_model`` instance.

        Args:
            messages: a prompt string, or the conversation (``Message``s or OpenAI-style dicts).
            response_model: a Pydantic model the answer must be JSON of.
            **sampling: overrides of the client's sampling for this request.

        Raises:
            CompletionError: the request failed; its ``result`` holds the error and its kind.
        """
        if isinstance(messages, str):
            messages = [Message.user(messages)]
        conversation = [Message.coerce(m) for m in messages]
        item = BatchItem("complete", conversation, response_model, sampling=sampling or None)
        result = await self.run_item(item)
        if not result.ok:
            raise CompletionError(result)
        return result.response

    @closes_after
    async def run_item(self, item: BatchItem) -> BatchResult:
        """Send one item with retries, pacing and validation; never raises for the item's
        own failure (it becomes the result's error), only for a fatal one (a rejected key)."""
        self.breaker.reset()
        return await self._run_item(item)

    async def _run_item(self, item: BatchItem) -> BatchResult:
        """``run_item`` inside a call that already holds the connections (the sinks' pool)."""
        backend = self._get_backend()
        config = self.config
        sampling = {**self.sampling, **item.sampling} if item.sampling else self.sampling
        try:
            schema = response_schema(item.response_model) if item.response_model else None
        except ItemError as exc:
            return failed_result(item, str(exc), "invalid_item", retryable=False, attempts=0)
        estimate = estimate_tokens(item, sampling) if self.limiter.tpm else 0
        usage = Usage()
        attempts = validation_failures = 0
        messages = item.messages  # grows by the answer and its correction on each re-ask
        breaker = self.breaker
        while True:
            if breaker.tripped:  # nothing answers at the endpoint: recorded as not sent, at once
                return breaker.not_sent(item, attempts)
            attempts += 1
            reserved = await self.limiter.acquire(estimate)
            try:
                completion = await backend.complete(messages, sampling, schema)
            except ItemError as exc:
                # A dialect found ignored: its answers were paid, as were the earlier re-asks.
                self._paid(reserved, exc.usage or Usage(), usage)
                return failed_result(item, str(exc), exc.kind, exc.retryable, attempts, usage)
            except ProviderError as exc:
                self.limiter.settle(reserved, 0)
                breaker.saw(exc)
                if isinstance(exc, KeyRefusedError):  # the key, not this item: the run stops
                    raise exc
                if not exc.retryable or attempts > config.max_retries:
                    return failed_result(item, str(exc), exc.kind, exc.retryable, attempts, usage)
                delay = backoff_delay(config, attempts, exc.retry_after)
                self.stats.retry(exc, item.id, attempts, delay)
                if exc.budget_spent:  # a sporadic 429 backs off alone; a spent budget, all
                    self.limiter.cool_down(delay)
                await breaker.sleep(delay)
                continue
            breaker.answered()
            self._paid(reserved, completion.usage, usage)
            finish = completion.finish_reason
            response: Any = completion.text  # plain text: nothing to judge (the common case)
            if item.response_model is not None or completion.refusal:
                verdict = judge(completion, item.response_model, max_tokens_of(sampling))
                if verdict.kind == VALIDATION and validation_failures < config.validation_retries:
                    # Asked again with what was wrong: the identical request buys the same.
                    assert schema is not None and verdict.error is not None
                    validation_failures += 1
                    messages = reask(messages, completion.text, verdict.error, schema)
                    continue
                if not verdict.ok:  # truncated, validation, refusal: a rerun buys the same
                    error, kind = verdict.error or "", verdict.kind or VALIDATION
                    return failed_result(item, error, kind, False, attempts, usage, finish)
                response = verdict.response
            return BatchResult(
                item.id,
                True,
                response,
                usage=usage,
                metadata=item.metadata,
                attempts=attempts,
                finish_reason=finish,
            )

    def _paid(self, reserved: int, spent: Usage, item_usage: Usage) -> None:
        """The tokens of one attempt's answers, counted by the rate limiter, the client's
        stats and the item's usage alike."""
        self.limiter.settle(reserved, spent.total_tokens)
        self.stats.used(spent.input_tokens, spent.output_tokens)
        item_usage.input_tokens += spent.input_tokens
        item_usage.output_tokens += spent.output_tokens

    # -- the three sinks --------------------------------------------------------------------

    async def batch_stream(
        self, items: Items, *, progress: bool = False
    ) -> AsyncIterator[BatchResult]:
        """Yield a BatchResult per item as each completes (completion order, not input order).

        Args:
            items: ``BatchItem``s, from a list, a generator or an async iterable.
            progress: show a progress bar on stderr.
        """
        # aclosing: a consumer that stops early closes the pool (and its connections) at once.
        async with aclosing(self._results(items, progress=progress)) as batches:
            async for batch in batches:
                for result in batch:
                    yield result

    async def batch_to_jsonl(
        self,
        items: Items,
        path: str | os.PathLike[str],
        *,
        resume: bool = False,
        retry_failed: bool = False,
        progress: bool = False,
        stop_grace_seconds: float = 20.0,
    ) -> int:
        """Write one JSON line per finished item to ``path``; return how many were written.

        ``resume=True`` skips the ids the file already holds (the file is the checkpoint; a
        torn last line from a crash is cut first). ``retry_failed=True`` also runs again the
        items whose recorded error is retryable, and keeps only their newest line.

        Ctrl-C (in the main thread, where it would raise ``KeyboardInterrupt``, ``asyncio.run``
        included) stops gracefully: no new item starts, the requests in flight come back for
        up to ``stop_grace_seconds`` and are written (they are paid for: a resume does not ask
        for them again), then the ``KeyboardInterrupt`` is raised. A second Ctrl-C stops at
        once.

        Raises:
            ConfigError: ``path`` already holds results and neither flag was given.
        """
        out = Path(path)
        plan = NOTHING_DONE
        if out.exists() and out.stat().st_size > 0:
            if not (resume or retry_failed):
                raise ConfigError(
                    f"{out} already holds results; pass resume=True to skip the items it "
                    "holds, or remove the file to start over"
                )
            plan = ResumePlan(FinishedIds.scan(out), retry_failed)  # ids on disk, not in memory
        written = 0
        ctrl_c = HeldCtrlC(stop_grace_seconds)
        try:
            with plan, ctrl_c.holding(), jsonl.JsonlWriter(out) as writer:
                async for batch in self._results(
                    items, progress=progress, plan=plan, record=writer.write_many
                ):
                    written += len(batch)
        finally:
            await ctrl_c.passed_on()  # the file is closed: a Ctrl-C held meanwhile goes on
        if retried := plan.retried:
            jsonl.drop_superseded(out, retried)
        return written

    async def batch_to_callback(
        self,
        items: Items,
        callback: Callable[[BatchResult], Any | Awaitable[Any]],
        *,
        progress: bool = False,
    ) -> int:
        """Call ``callback(result)`` (sync or async) for each result; return how many."""
        count = 0
        async with aclosing(self._results(items, progress=progress)) as batches:
            async for batch in batches:
                for result in batch:
                    outcome = callback(result)
                    if outcome is not None and inspect.isawaitable(outcome):
                        await outcome
                    count += 1
        return count

    @closes_after_stream
    def _results(
        self,
        items: Items,
        *,
        progress: bool,
        plan: ResumePlan = NOTHING_DONE,
        record: Callable[[list[BatchResult]], None] | None = None,
    ) -> AsyncGenerator[list[BatchResult], None]:
        """The core loop shared by the sinks: the results that completed together, recorded,
        counted and checked (llm_kit.delivery)."""
        config = self.config
        self.breaker.reset()  # a new run: the endpoint gets its chance again
        total = max(0, len(items) - plan.skipped) if isinstance(items, Sized) else None
        pool = run_pool(
            items,
            self._run_item,
            workers=config.worker_concurrency,
            buffer_size=config.input_buffer_size,
            skip=plan.skip if plan.finished.lines else None,
        )
        fail_fast = config.on_failure == "raise"
        return delivered(pool, total=total, progress=progress, record=record, fail_fast=fail_fast)


__all__ = ["LLM", "require_key"]
