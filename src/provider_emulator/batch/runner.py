"""The work of a batch job, the same for every provider: answer, pace, stop, finish.

A provider supplies a ``Dialect``: how it validates its input, how a result line looks, where
failures go. The runner answers one request at a time in (shuffled) order, keeping pace with
the job's clock: with ``batch_delay_s = D`` the i-th of N requests is answered no earlier than
``i/N·D`` after creation, so at a cancel exactly the share of requests that the elapsed time
allows is finished, and the CPU work of many long jobs is spread over their delay. It yields to
the event loop every few milliseconds so that polls stay responsive while 50,000 requests run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from pathlib import Path
from typing import NamedTuple, Protocol

from provider_emulator.batch.input import BatchInput, Slicer
from provider_emulator.batch.job import INVALID_SHARE, BatchJob, Fate, ItemFault, Outcome
from provider_emulator.batch.store import BatchStore

logger = logging.getLogger(__name__)

_WRITE_BUFFER = 1 << 20


class Answer(NamedTuple):
    line: bytes
    ok: bool
    input_tokens: int = 0
    output_tokens: int = 0


class Output(NamedTuple):
    """A file of result lines the runner wrote."""

    path: Path
    size: int
    lines: int


class Dialect(Protocol):
    """What a provider adds to the runner. Items are raw input lines; each method decodes."""

    shuffled: bool  # results come out in a seeded random order (OpenAI, Anthropic)
    split_errors: bool  # failures go to a file of their own (OpenAI's error file)
    fails_per_item: bool  # a failed batch fails request by request (Anthropic)
    expired_keeps_results: bool  # an expired job keeps what it finished (not Gemini)

    async def prepare(self, job: BatchJob) -> BatchInput | None:
        """The job's requests, or None when validation failed (``job.errors`` says why)."""
        ...

    async def answer(self, item: bytes) -> Answer: ...

    def fault(self, item: bytes, fault: ItemFault) -> bytes: ...

    def unfinished(self, item: bytes, outcome: Outcome) -> bytes | None:
        """The line of a request the job never ran (cancelled or expired), if any."""
        ...

    def fail_batch(self, job: BatchJob) -> None:
        """Record an injected whole-batch failure in ``job.errors``."""
        ...

    def publish(self, job: BatchJob, output: Output, errors: Output | None) -> None:
        """Make the written files reachable from the job (and remove empty ones)."""
        ...


class _Sink:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = path.open("wb", buffering=_WRITE_BUFFER)
        self.size = 0
        self.lines = 0

    def write(self, line: bytes) -> None:
        self._handle.write(line)
        self.size += len(line)
        self.lines += 1

    def close(self) -> Output:
        self._handle.close()
        return Output(self.path, self.size, self.lines)


class _Faults:
    """The seeded per-request draw of injected item errors."""

    def __init__(self, rate: float, rng: random.Random) -> None:
        self._rate = rate
        self._rng = rng

    def draw(self) -> ItemFault | None:
        if self._rate <= 0 or self._rng.random() >= self._rate:
            return None
        return ItemFault.INVALID if self._rng.random() < INVALID_SHARE else ItemFault.SERVER


class Runner:
    """Runs the jobs of one emulator process; ``run`` is a job's whole background life."""

    def __init__(self, store: BatchStore, item_error_rate: float, expire_done: float) -> None:
        self._store = store
        self._item_error_rate = item_error_rate
        self._expire_done = expire_done

    def start(self, job: BatchJob, dialect: Dialect) -> None:
        self._store.add_job(job)
        job.task = self._store.start(self.run(job, dialect))

    async def run(self, job: BatchJob, dialect: Dialect) -> None:
        source: BatchInput | None = None
        try:
            source = await dialect.prepare(job)
            job.validated_at = time.time()
            if source is None:
                job.finish(Outcome.FAILED, job.planned_end(Outcome.FAILED))
                return
            job.total = len(source)
            if job.fate is Fate.FAILED and not dialect.fails_per_item:
                dialect.fail_batch(job)
                job.finish(Outcome.FAILED, job.planned_end(Outcome.FAILED))
                return
            await self._answer_all(job, dialect, source)
        except asyncio.CancelledError:
            raise
        except Exception:  # an emulator bug: the job fails rather than hanging forever
            logger.exception("batch %s failed inside the emulator", job.id)
            message = "The emulator failed this batch (see its log)."
            job.errors = [{"code": "server_error", "message": message, "param": None, "line": None}]
            job.finish(Outcome.FAILED, time.time())
        finally:
            if source is not None:
                source.close()

    async def _answer_all(self, job: BatchJob, dialect: Dialect, source: BatchInput) -> None:
        rng = random.Random(job.seed)
        if dialect.shuffled:
            source.shuffle(rng)
        target = job.total
        if job.fate is Fate.EXPIRED:
            target = math.floor(job.total * self._expire_done)
            target = target if dialect.expired_keeps_results else 0
        output = _Sink(self._store.new_path(f"{job.provider}-results.jsonl"))
        errors = (
            _Sink(self._store.new_path(f"{job.provider}-errors.jsonl"))
            if dialect.split_errors
            else output
        )
        sinks = (output, errors)
        try:
            faults = _Faults(self._item_error_rate, rng)
            every_item_fails = job.fate is Fate.FAILED  # only reached when fails_per_item
            done = await self._answer(job, dialect, source, sinks, target, faults, every_item_fails)
            outcome = await self._outcome(job)
            slicer = Slicer()
            for index in range(done, job.total):
                line = dialect.unfinished(source.read(index), outcome)
                if line is not None:
                    errors.write(line)
                await slicer.tick()
        except BaseException:  # deleted, shut down, or a bug: leave no half-written files
            for sink in {id(sink): sink for sink in sinks}.values():
                sink.close().path.unlink(missing_ok=True)
            raise
        if outcome is Outcome.CANCELLED:
            job.canceled = job.total - done
        elif outcome is Outcome.EXPIRED:
            job.expired = job.total - done
        dialect.publish(job, output.close(), errors.close() if errors is not output else None)
        job.finish(outcome, job.planned_end(outcome))

    async def _answer(
        self,
        job: BatchJob,
        dialect: Dialect,
        source: BatchInput,
        sinks: tuple[_Sink, _Sink],
        target: int,
        faults: _Faults,
        every_item_fails: bool,
    ) -> int:
        """Answer requests in order until ``target`` (or a cancel); returns how many were."""
        index = 0
        slicer = Slicer()
        while index < target:
            if job.cancel_at is not None:
                target = min(target, max(index, job.items_due(job.cancel_at)))
                if index >= target:
                    break
            due = job.items_due(time.time())
            if due <= index and job.cancel_at is None:
                await job.sleep(job.due((index + 1) / job.total) - time.time())
                continue
            stop = min(target, due) if job.cancel_at is None else target
            while index < stop:
                item = source.read(index)
                fault = ItemFault.SERVER if every_item_fails else faults.draw()
                if fault is not None:
                    sinks[1].write(dialect.fault(item, fault))
                    job.errored += 1
                else:
                    answer = await dialect.answer(item)
                    sinks[0 if answer.ok else 1].write(answer.line)
                    if answer.ok:
                        job.succeeded += 1
                    else:
                        job.errored += 1
                    job.input_tokens += answer.input_tokens
                    job.output_tokens += answer.output_tokens
                index += 1
                if await slicer.tick() and job.cancel_at is not None:
                    break
        return index

    @staticmethod
    async def _outcome(job: BatchJob) -> Outcome:
        """Completed, or cancelled; an expiring job waits for its deadline unless cancelled."""
        if job.cancel_at is None and job.fate is Fate.EXPIRED:
            await job.sleep(job.due(1.0) - time.time())
            if job.cancel_at is None:
                return Outcome.EXPIRED
        return Outcome.CANCELLED if job.cancel_at is not None else Outcome.COMPLETED
