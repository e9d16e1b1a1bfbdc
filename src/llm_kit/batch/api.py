"""The provider-batch half of `LLM`: submit, poll, fetch, cancel, resubmit, run end to end."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from llm_kit import jsonl
from llm_kit.answers import max_tokens_of
from llm_kit.backends import Backend, HttpBackend
from llm_kit.batch import runner, spools
from llm_kit.batch.job import BatchJob, BatchJobStatus
from llm_kit.errors import BatchSubmitError, ConfigError, ProviderError
from llm_kit.pipeline import Items
from llm_kit.providers import batch_provider_names, get_codec, provider_spec
from llm_kit.providers.batch_backend import BatchBackend, BatchLimits, Chunk
from llm_kit.sessions import BackendScope, closes_after, closes_after_stream
from llm_kit.types import BatchConfig, BatchItem, BatchResult

logger = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    # Compatibility name for callers of the former table: the registry's batch backends.
    if name == "BATCH_BACKENDS":
        return {n: provider_spec(n).batch_backend for n in batch_provider_names()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def default_spool_dir(provider: str) -> Path:
    root = os.environ.get("LLM_KIT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "llm_kit"
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(root) / "batches" / f"{provider}-{stamp}-{uuid.uuid4().hex[:8]}"


class BatchAPI:
    """Mixed into `LLM`: the same items in and BatchResults out as the live pipeline."""

    model: str
    message_format: str
    base_url: str | None
    config: BatchConfig
    sampling: dict[str, Any]
    _scope: BackendScope

    def _get_backend(self) -> Backend:
        raise NotImplementedError

    def _batch_backend(self) -> BatchBackend:
        cls = provider_spec(self.message_format).batch_backend
        if cls is None:
            raise ConfigError(
                f"message_format {self.message_format!r} has no provider batch API; use the live "
                "pipeline (batch_to_jsonl) or one of: " + ", ".join(batch_provider_names())
            )
        backend = self._get_backend()
        assert isinstance(backend, HttpBackend)
        batch_backend = cls(backend.codec, backend.transport, self.model)
        batch_backend.key_names = backend.key_names  # a refusal of the key names them
        return batch_backend

    def _limits(self, backend: BatchBackend) -> BatchLimits:
        max_requests = backend.limits.max_requests
        if self.config.batch_max_requests is not None:
            max_requests = min(
                max_requests or self.config.batch_max_requests, self.config.batch_max_requests
            )
        max_bytes = min(
            backend.limits.max_bytes, self.config.batch_max_bytes or backend.limits.max_bytes
        )
        return BatchLimits(max_requests, max_bytes)

    def _check_job(self, job: BatchJob) -> BatchBackend:
        if job.provider != self.message_format:
            raise ConfigError(
                f"this job was submitted to {job.provider}, but this LLM talks "
                f"{self.message_format}; use LLM(message_format={job.provider!r}, ...)"
            )
        return self._batch_backend()

    @closes_after
    async def submit_batch(
        self,
        items: Iterable[BatchItem],
        *,
        spool_dir: str | os.PathLike[str] | None = None,
        keep_spool: bool = False,
    ) -> BatchJob:
        """Serialise every request to disk, split into provider-legal batches, upload, create.

        If a creation fails after others succeeded, ``BatchSubmitError.job`` holds the batches
        the provider has: save it; ``resubmit_failed`` sends the items left out.

        Args:
            items: the ``BatchItem``s (a sync iterable).
            spool_dir: where the request files are written (``None``: a new folder under
                ``$LLM_KIT_CACHE_DIR/batches``, by default ``~/.cache/llm_kit/batches``).
                Once ``fetch_batch_results`` has handed over every result, only the requests
                of retryable failures stay there (for ``resubmit_failed``); none left, the
                folder goes. A submission that creates no batch removes it at once.
            keep_spool: keep every request file after the fetch (saved in the job).

        Returns:
            The job handle: ``save`` it to poll and fetch from another process.
        """
        backend = self._batch_backend()
        directory = Path(spool_dir) if spool_dir else default_spool_dir(backend.name)
        job, chunks = await self._spool(backend, items, directory)
        job.keep_spool = keep_spool
        try:
            await runner.create_batches(backend, job, chunks)
        except asyncio.CancelledError:
            if job.batches:  # the handle dies with this call: say what the provider holds
                logger.warning(
                    "submit_batch was stopped after creating %d provider batches: %s",
                    len(job.batches),
                    ", ".join(job.batch_ids),
                )
            elif not keep_spool:  # no handle leaves this call: nothing can read the spool
                spools.remove_all(directory)
            raise
        except Exception as exc:
            if not job.batches:
                if not keep_spool:
                    spools.remove_all(directory)
                raise
            raise BatchSubmitError(
                f"{len(job.batches)} of {len(chunks)} batches were created before this failure: "
                f"{exc}. Save exc.job to keep them; resubmit_failed(exc.job) sends the rest",
                job,
            ) from exc
        return job

    async def _spool(
        self,
        backend: BatchBackend,
        items: Iterable[BatchItem],
        directory: Path,
        models: dict[str, type[BaseModel]] | None = None,
    ) -> tuple[BatchJob, list[Chunk]]:
        """Build every request on disk (in a thread: the event loop stays free), collecting
        the response models into ``models`` on the way when asked."""

        def remember(item: BatchItem) -> None:
            if models is not None and item.response_model is not None:
                models[item.id] = item.response_model

        return await asyncio.to_thread(
            runner.spool,
            items,
            backend=backend,
            codec=get_codec(self.message_format),
            sampling=self.sampling,
            limits=self._limits(backend),
            directory=directory,
            base_url=self.base_url or "",
            on_model=remember,
        )

    @closes_after
    async def poll_batch(self, job: BatchJob) -> BatchJobStatus:
        """Ask the provider how every batch of the job is doing; updates ``job`` in place."""
        await runner.refresh(self._check_job(job), job)
        return job.status()

    @closes_after_stream
    async def fetch_batch_results(
        self, job: BatchJob, items: Items | None = None
    ) -> AsyncGenerator[BatchResult, None]:
        """One BatchResult per item, validated against each item's response_model when the
        items are given again (a Python type cannot live in the job file).

        Once every result has been handed over, the job's spool is cut down to the requests
        of retryable failures (``resubmit_failed`` sends them from there), unless the job was
        submitted with ``keep_spool=True``; stopping early leaves it whole.

        Raises:
            BatchNotFinishedError: some of the job's batches are still running.
        """
        models = runner.models_of(items)
        limit = max_tokens_of(self.sampling)
        seen = spools.RetryableSeen(job)
        async for result in seen.watch(runner.outcomes(self._check_job(job), job, models, limit)):
            yield result
        await asyncio.to_thread(spools.prune, job, seen)

    @closes_after
    async def cancel_batch(self, job: BatchJob) -> BatchJobStatus:
        """Stop every running batch; what finished stays billed and fetchable."""
        backend = self._check_job(job)
        await asyncio.gather(*(backend.cancel(b) for b in job.batches if not b.state.is_terminal))
        return job.status()

    @closes_after
    async def resubmit_failed(
        self,
        job: BatchJob,
        items: Iterable[BatchItem] | None = None,
        *,
        kinds: Iterable[str] | None = None,
        on_created: Callable[[], None] | None = None,
    ) -> int:
        """Send again, as new batches of the same job, every item whose outcome is a retryable
        failure (errored, expired, canceled, missing, not submitted), or only those whose
        ``error_kind`` is in ``kinds``. Returns how many were resubmitted. The requests come
        from the job's spool files, or from ``items`` when given. An answer that missed its
        response_model (``validation``, ``truncated``) is never resubmitted: the same request
        would buy the same answer. ``on_created`` runs before and after each new batch (to save
        the handle). Batches an interrupted creation left at the provider (``job.intents``) are
        found and adopted first, never paid for twice.

        Args:
            job: the job to complete; its new batches are added to it.
            items: the original items, to rebuild requests from and validate against.
            kinds: resubmit only failures of these ``error_kind``s.
            on_created: called before and after each new batch is created.
        """
        backend = self._check_job(job)
        if job.intents:
            await runner.adopt_orphans(backend, job)
            if on_created is not None:
                on_created()
        wanted = set(kinds) if kinds is not None else None
        failed = {
            index
            async for index, result in runner.outcomes(backend, job, runner.models_of(items))
            if not result.ok
            and result.retryable
            and (wanted is None or result.error_kind in wanted)
        }
        if not failed:
            return 0
        spool_root = Path(job.spool_dir) if job.spool_dir else default_spool_dir(backend.name)
        chunks = await asyncio.to_thread(
            runner.respool,
            job,
            failed,
            backend=backend,
            limits=self._limits(backend),
            directory=spool_root / f"retry-{len(job.batches):04d}",
            items=items,
            codec=get_codec(self.message_format),
            sampling=self.sampling,
        )
        await runner.create_batches(backend, job, chunks, on_created)
        return len(failed)

    @closes_after
    async def run_batch_api(
        self,
        items: Items,
        path: str | os.PathLike[str],
        *,
        poll_interval: float = 60.0,
        retry_failed: bool = False,
        max_rounds: int = 3,
        progress: bool = False,
    ) -> int:
        """Submit, poll until every batch ends, write reconciled results to ``path``; return
        how many lines were written.

        The job handle lives beside the output (``<path>.job.json``) until the results are
        written: run it again after a crash and it resumes the same provider batches instead
        of paying twice. Ids already in the output are skipped, as with
        ``batch_to_jsonl(resume=True)``; with ``retry_failed=True`` items recorded there with a
        retryable error are sent again too, and failures are resubmitted (up to
        ``max_rounds``) before the results are written.

        Args:
            items: the ``BatchItem``s (a sync iterable).
            path: the JSONL results file.
            poll_interval: seconds between status polls.
            retry_failed: resend retryable failures, in up to ``max_rounds`` rounds.
            max_rounds: the most resubmission rounds with ``retry_failed``.
            progress: show a progress bar on stderr.
        """
        if not isinstance(items, Iterable):
            raise ConfigError("run_batch_api needs a (sync) iterable of BatchItem")
        out = Path(path)
        job_path = out.with_name(out.name + ".job.json")
        reusable = isinstance(items, list | tuple)
        models: dict[str, type[BaseModel]] = {}
        if job_path.exists():
            job = BatchJob.load(job_path)
            self._check_job(job)
            models = runner.models_of(items) if reusable else {}
            await self._wait(job, job_path, poll_interval, progress)
            # A crash while the batches were being created: send what never left, once.
            await self.resubmit_failed(
                job, kinds={"not_submitted"}, on_created=lambda: job.save(job_path)
            )
        else:
            checkpoint = jsonl.scan(out)
            skip = checkpoint.done - checkpoint.retryable if retry_failed else checkpoint.done
            pending = [item for item in items if item.id not in skip]
            if not pending:
                return 0
            backend = self._batch_backend()
            spool_dir = out.with_name(out.name + ".spool")
            shutil.rmtree(spool_dir, ignore_errors=True)  # no handle: nothing of it was sent
            job, chunks = await self._spool(backend, pending, spool_dir, models)
            job.save(job_path)  # before any upload: a crash leaves a handle that can resubmit
            await runner.create_batches(backend, job, chunks, lambda: job.save(job_path))
        rounds = 0
        while True:
            await self._wait(job, job_path, poll_interval, progress)
            if not retry_failed or rounds >= max_rounds:
                break
            resent = await self.resubmit_failed(
                job, items if reusable else None, on_created=lambda: job.save(job_path)
            )
            if not resent:
                break
            rounds += 1
        backend = self._check_job(job)
        seen = spools.RetryableSeen(job)
        outcomes = runner.outcomes(backend, job, models, max_tokens_of(self.sampling))
        written, _ = await jsonl.append_results(out, seen.watch(outcomes))
        # The output now holds every item of the job: the handle has done its work, and of
        # the spool only the requests of retryable failures stay (for resubmit_failed).
        job_path.replace(out.with_name(out.name + ".job.done.json"))
        await asyncio.to_thread(spools.prune, job, seen)
        known = set(job.item_ids)
        if reusable and any(i.id not in known for i in items):
            # Items added since the job was submitted: a new job for them.
            written += await self.run_batch_api(
                items,
                out,
                poll_interval=poll_interval,
                retry_failed=retry_failed,
                max_rounds=max_rounds,
                progress=progress,
            )
        return written

    async def _wait(
        self, job: BatchJob, job_path: Path, poll_interval: float, progress: bool
    ) -> None:
        """Poll until every batch has ended; a transient error only delays the next poll."""
        failures = 0
        while True:
            try:
                status = await self.poll_batch(job)
            except ProviderError as exc:
                if not exc.retryable:
                    raise
                failures += 1
                logger.warning("polling failed (%s); trying again", exc)
                await asyncio.sleep(min(poll_interval, 2.0**failures))
                continue
            failures = 0
            job.save(job_path)
            if progress:
                print(f"batch job {status}", file=sys.stderr, flush=True)
            if status.state.is_terminal:
                return
            await asyncio.sleep(poll_interval)
