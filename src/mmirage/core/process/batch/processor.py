"""``type: batch_api``: rows become provider batch requests; the shard keeps placeholders.

Per request: the neutral payload (``payload.py``) → the adapter's request line → the spool of
its modality (``spool.py``), durable before the runner checkpoints the row. A chunk that fills
is submitted in the background while rows keep coming (at most two submissions at once), its
receipt appended (``receipts.py``) and marked done; ``finish`` submits the last chunks before
the shard is published, and a failed submission fails the shard, whose rerun submits exactly
the chunks that have no receipt. The row's value is ``__BATCH_SUBMITTED__:<custom_id>``.

A request is never submitted twice either: once the provider holds a chunk, the shard's answer
store is told (``RunContext.submitted``) a digest of each request line under its custom_id. A
shard computed again after a config edit spools only the requests whose line changed (or that
were never sent); the others keep their placeholder, answered by the batch that holds them.

A creation is never paid twice (``creation.py``, ``intents.py``): its intent is on disk before
the adapter is called, a rerun adopts the batch an interrupted creation left at the provider,
and the whole creation, receipt included, runs in a worker thread that a stop (Ctrl-C,
SIGTERM) does not cut short: ``aclose`` waits for it (at most ``STOP_GRACE_S``).

Under ``--export-prompts`` nothing is submitted and no key is needed: each closed chunk is
appended to the export file as ``{"batch_id", "request"}`` lines and gets a dry-run receipt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from llm_kit.errors import ImageTypeError, NoBatchAPIError
from mmirage.core.process.base import OutputRequest, OutputResult, Processor, RunContext
from mmirage.core.process.batch.adapter import BatchSubmissionAdapter
from mmirage.core.process.batch.cost import PriceBook, estimate_request_tokens, schema_tokens
from mmirage.core.process.batch.creation import STOP_GRACE_S, ChunkCreator
from mmirage.core.process.batch.intents import (
    print_unsaved_receipt,
    read_intent,
    record_receipt,
)
from mmirage.core.process.batch.payload import (
    build_payload,
    custom_id_for,
    image_type_refused,
    modality_of,
)
from mmirage.core.process.batch.receipts import (
    append_receipt,
    chunk_receipt,
    endpoint,
    receipt_path,
    redact,
)
from mmirage.core.process.batch.registry import BatchAdapterRegistry
from mmirage.core.process.batch.spool import ChunkSpool, SpooledChunk, read_lines
from mmirage.core.process.batch.versions import SubmittedVersions
from mmirage.core.render.renderer import make_placeholder
from mmirage.errors import UserError

logger = logging.getLogger(__name__)

_MAX_SUBMISSIONS = 2  # chunks uploading at once: enough to overlap, gentle on the provider


def export_file(path: str, run_id: str) -> Path:
    """``X.jsonl`` → ``X.<run_id>.jsonl``; any other path is a directory that gets
    ``exported_prompts.<run_id>.jsonl``."""
    expanded = os.path.expanduser(path)
    if expanded.endswith(".jsonl"):
        return Path(f"{expanded.removesuffix('.jsonl')}.{run_id}.jsonl")
    return Path(expanded) / f"exported_prompts.{run_id}.jsonl"


class BatchApiProcessor(Processor):
    def request_identity(self, output: Any) -> Any:
        return None  # the spool remembers every request; merge reads the results store

    @classmethod
    def from_config(cls, config: Any, context: RunContext | None = None) -> BatchApiProcessor:
        if context is None:
            raise ValueError("a batch_api processor needs the run's context")
        return cls(config, context)

    def __init__(self, config: Any, context: RunContext) -> None:
        self.config = config
        self.provider_config = config.provider_config
        self.context = context
        self.dry_run = context.export_prompts is not None
        # The key is checked here, before any row (skipped for a dry run: nothing is sent).
        self.adapter: BatchSubmissionAdapter = BatchAdapterRegistry.create(
            self.provider_config, allow_missing_credentials=self.dry_run
        )
        self._exact_size = (
            type(self.adapter).estimate_request_bytes
            is BatchSubmissionAdapter.estimate_request_bytes
        )
        self.export_path: Path | None = None
        if context.export_prompts is not None:
            self.export_path = export_file(context.export_prompts, context.run_id)
            self.export_path.parent.mkdir(parents=True, exist_ok=True)
            self.export_path.touch()  # fail now, not after the first chunk, on a bad path
        name = config.name or config.type
        self.base = context.run_dir.receipt_base(name)
        self._root = context.run_dir.batch_spool_dir(name, context.shard_id, dry_run=self.dry_run)
        if context.fresh and self._root.exists():
            # --fresh: every request is built and sent anew; what earlier runs spooled is set
            # aside (its receipts name it, for retry).
            self._root.rename(
                self._root.with_name(f"{self._root.name}.superseded-{context.run_id}")
            )
        self._recompute = context.recompute
        self._versions = SubmittedVersions(
            context.submitted, endpoint(self.provider_config), dry_run=self.dry_run
        )
        self._resume_from = 0
        self._spools: dict[str, ChunkSpool] = {}
        self._pending: list[SpooledChunk] = []  # recovered, not yet submitted
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(_MAX_SUBMISSIONS)
        # Own threads, so that a stop can wait for exactly the creations in flight. A dry run
        # appends chunks to one file: one thread keeps them in chunk order.
        self._threads = concurrent.futures.ThreadPoolExecutor(
            1 if self.dry_run else _MAX_SUBMISSIONS, thread_name_prefix="batch-submit"
        )
        self._creations: set[concurrent.futures.Future[list[tuple[str, str]]]] = set()
        self._creator = ChunkCreator(self._root.parent.parent)
        self._failure: BaseException | None = None
        self._schemas: dict[str, dict[str, Any] | None] = {}
        self.submitted_batches = 0
        self.spooled_bytes = 0  # request bytes spooled by this run
        self.spooled_tokens = 0  # their estimated input tokens, for the cost estimate
        self.prices = PriceBook.from_providers([self.provider_config])

    # -- the Processor protocol ------------------------------------------------------------

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        self._raise_if_failed()
        results: list[OutputResult] = []
        built: list[tuple[str, str, OutputRequest, bytes]] = []
        for request in requests:
            modality = modality_of(request)
            custom_id = custom_id_for(output.name, modality, request.source_index)
            results.append(OutputResult(value=make_placeholder(custom_id)))
            if custom_id in self._spool(modality).spooled:  # an interrupted run's: not twice
                continue
            try:
                line = self._line(custom_id, request, output)
            except ImageTypeError as exc:  # the batch page: raised before submission
                raise image_type_refused(self.provider_config.provider, request, exc) from None
            except (ValueError, OSError) as exc:  # llm_kit's ItemError is a ValueError
                why = str(exc).removeprefix(f"request {custom_id}: ")  # named once, here
                results[-1] = OutputResult(error=f"request '{custom_id}': {why}")
                continue
            built.append((custom_id, modality, request, line))
        held = self._versions.held([custom_id for custom_id, *_ in built])
        by_modality: dict[str, list[tuple[str, int, int, bytes]]] = {}
        billed_schema = schema_tokens(self._schema(output))  # billed with every request
        for custom_id, modality, request, line in built:
            if held and held.get(custom_id) == self._versions.version(line):
                continue  # the provider holds this very request already
            self.spooled_tokens += estimate_request_tokens(
                request.prompt, billed_schema, len(request.image_urls)
            )
            dataset = int(request.row_key.split(":", 1)[0])
            by_modality.setdefault(modality, []).append(
                (custom_id, request.source_index, dataset, line)
            )
        spooling = sum(len(lines) for lines in by_modality.values())
        self._versions.count(reused=len(built) - spooling, sent=spooling)
        for modality, lines in by_modality.items():
            self.spooled_bytes += sum(len(line) for *_, line in lines)
            for chunk in self._spool(modality).add_many(lines):
                self._submit_later(modality, chunk)
        return results

    def resume_at(self, source_index: int) -> None:
        """The runner's checkpoint: rows before ``source_index`` will not come again."""
        self._resume_from = source_index

    async def finish(self) -> str | None:
        """Submit every chunk still open or pending — also those an interrupted run left in a
        modality this run had no row for; raise if any submission failed. Returns the cost
        estimate of what this dataset submitted (or exported)."""
        if self._root.is_dir():
            for entry in sorted(os.listdir(self._root)):
                if (self._root / entry).is_dir():
                    self._spool(entry)
        for modality, spool in self._spools.items():
            for chunk in spool.close():
                self._submit_later(modality, chunk)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._raise_if_failed()
        if not self.spooled_bytes:
            return None
        model = str(getattr(self.provider_config, "model", self.provider_config.provider))
        estimate = self.prices.estimate_input(model, self.spooled_tokens)
        self.spooled_bytes = self.spooled_tokens = 0
        return f"{'exported' if self.dry_run else 'submitted'} {estimate.describe()}"

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._drain_creations()
        self._threads.shutdown(wait=False)

    async def _drain_creations(self) -> None:
        """Wait (bounded) for the creations in flight: the provider may hold their batches
        already, and their receipts are written by the threads that created them."""
        pending = [f for f in self._creations if not f.done()]
        if not pending:
            return
        logger.warning(
            "stopping: waiting up to %.0f s for %d batch creation(s) in flight, so that their "
            "receipts are written",
            STOP_GRACE_S,
            len(pending),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE_S
        waiting = [asyncio.wrap_future(f) for f in pending]
        while loop.time() < deadline and not all(f.done() for f in pending):
            try:
                await asyncio.wait(waiting, timeout=deadline - loop.time())
            except asyncio.CancelledError:
                continue  # a second cancel (the loop shutting down) must not cut the wait short

    # -- requests ------------------------------------------------------------------------------

    def _line(self, custom_id: str, request: OutputRequest, output: Any) -> bytes:
        payload = build_payload(request, output, self._schema(output))
        built = self.adapter.build_request(custom_id, payload, self.provider_config)
        line = orjson.dumps(built, option=orjson.OPT_APPEND_NEWLINE)
        if not self._exact_size:
            # A custom adapter's estimate may exceed the serialized size: pad the accounting
            # by the difference so chunking follows its estimate, as the contract says.
            extra = self.adapter.estimate_request_bytes(built) - (len(line) - 1)
            if extra > 0:
                line = line[:-1] + b" " * extra + b"\n"
        return line

    def _schema(self, output: Any) -> dict[str, Any] | None:
        if output.name not in self._schemas:
            is_json = getattr(output, "is_json", False)
            self._schemas[output.name] = output.schema.json_schema() if is_json else None
        return self._schemas[output.name]

    def _spool(self, modality: str) -> ChunkSpool:
        spool = self._spools.get(modality)
        if spool is None:
            pc = self.provider_config
            cap = pc.max_requests_per_chunk or getattr(self.adapter, "max_requests_per_batch", None)
            spool = ChunkSpool(
                self._root / modality, pc.max_chunk_bytes, cap, pc.oversized_request_policy
            )
            # Recomputed: chunks never sent hold requests of the old configuration; those
            # still asked for are spooled again. One being created when its run stopped
            # (it has an intent) stays: the provider may hold its batch already.
            keep = (lambda chunk: read_intent(chunk) is not None) if self._recompute else None
            unsent = spool.recover(self._resume_from, keep_unsent=keep)
            if unsent:
                logger.warning(
                    "resuming %d unsent chunk(s) of %s, left by an interrupted run",
                    len(unsent),
                    spool.directory,
                )
            for chunk in unsent:
                self._submit_later(modality, chunk)
            for chunk in spool.unreceipted:
                self._write_receipt(modality, chunk, orjson.loads(chunk.done_path.read_bytes()))
            spool.unreceipted.clear()
            for chunk in spool.unremembered:
                self._versions.recover(chunk)
            spool.unremembered.clear()
            self._spools[modality] = spool
        return spool

    # -- submission ----------------------------------------------------------------------------

    def _submit_later(self, modality: str, chunk: SpooledChunk) -> None:
        task = asyncio.get_running_loop().create_task(self._submit(modality, chunk))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _submit(self, modality: str, chunk: SpooledChunk) -> None:
        try:
            async with self._slots:
                if self._failure is not None:
                    return  # the shard is failing: leave the chunk for the rerun
                creation = self._threads.submit(self._submit_sync, modality, chunk)
                self._creations.add(creation)
                creation.add_done_callback(self._creations.discard)
                # Shielded: cancelling this task must not abandon the thread's answer.
                versions = await asyncio.shield(asyncio.wrap_future(creation))
                self._versions.sent(chunk, versions)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc

    def _write_receipt(self, modality: str, chunk: SpooledChunk, receipt: dict[str, Any]) -> None:
        try:
            append_receipt(self._receipt_file(modality), receipt)
            chunk.receipted_path.touch()
        except OSError as exc:
            print_unsaved_receipt(receipt, exc)
            raise

    def _receipt_file(self, modality: str) -> Path:
        return receipt_path(self.base, modality, self.context.run_id, dry_run=self.dry_run)

    def _submit_sync(self, modality: str, chunk: SpooledChunk) -> list[tuple[str, str]]:
        """Create the chunk's batch and write its receipt; the versions of its requests."""
        chunk_id = f"s{self.context.shard_id}-chunk-{chunk.number:06d}"
        lines = read_lines(chunk)
        ids = list(chunk.read_ids())
        if self.dry_run:
            assert self.export_path is not None
            batch_id = f"{modality}-{chunk_id}"
            prefix = b'{"batch_id":' + orjson.dumps(batch_id) + b',"request":'
            data = b"".join(prefix + line.rstrip() + b"}\n" for line in lines)
            with open(self.export_path, "ab") as f:
                f.write(data)
            provider_batch_id, status, raw = f"dry-run-{batch_id}", "dry_run", {}
        else:
            raw = self._creator.create(
                self.adapter,
                self.provider_config,
                chunk,
                chunk_id,
                [orjson.loads(line) for line in lines],
            )
            result = self.adapter.parse_submission_result(raw)
            provider_batch_id, status = result.provider_batch_id, result.status
            logger.info(
                "submitted %s (%d requests) as %s batch %s",
                chunk_id,
                len(lines),
                self.provider_config.provider,
                provider_batch_id,
            )
        receipt = chunk_receipt(
            self.provider_config,
            chunk,
            lines,
            ids,
            chunk_id=chunk_id,
            batch_id=provider_batch_id,
            status=status,
            raw=redact(raw, self.adapter.credentials.values()),
            modality=modality,
            processor=self.config.name or self.config.type,
            run_id=self.context.run_id,
            shard_id=self.context.shard_id,
            num_shards=self.context.num_shards,
            pipeline_id=self.context.run_dir.pipeline_id,
            fingerprint=self.context.run_dir.fingerprint,
        )
        record_receipt(chunk, receipt, self._receipt_file(modality))
        self.submitted_batches += 1
        return self._versions.of_chunk(chunk, lines)

    def _raise_if_failed(self) -> None:
        if isinstance(self._failure, NoBatchAPIError):  # nothing created: a rerun cannot help
            raise UserError(
                f"{self._failure.finding}: use an llm processor (type: llm) in place of "
                "batch_api for this server"
            ) from None
        if self._failure is not None:
            exc = self._failure
            if isinstance(exc, OSError) and exc.filename is not None:
                problem = f"{exc.strerror} ({exc.filename})"
            else:
                problem = str(exc)
            problem = str(redact(problem, self.adapter.credentials.values()))
            raise RuntimeError(
                f"submitting a batch to {self.provider_config.provider} failed: {problem}; "
                "rerun to submit the chunks that have no receipt yet"
            ) from None
