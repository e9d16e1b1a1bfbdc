"""`mmirage job status|fetch|cancel|resubmit job.json`: provider batch jobs made from Python.

The job file is the handle `BatchJob.save()` wrote; the key comes from the provider's
environment variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from mmirage.cli.errors import exit_on_errors

# llm_kit is imported inside the commands: `mmirage --help` should not pay for it.
if TYPE_CHECKING:
    from llm_kit import LLM, BatchJob
    from llm_kit.batch import BatchJobStatus

T = TypeVar("T")
JOB_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


def _run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``work``; an error a user can cause becomes one sentence and exit 2 (config) or 1."""
    with exit_on_errors():
        return asyncio.run(work())


def _load(job_file: Path) -> BatchJob:
    from llm_kit import BatchJob

    return BatchJob.load(job_file)


def _client(job: BatchJob) -> LLM:
    from llm_kit import LLM
    from llm_kit.client import require_key

    require_key(job.provider)  # a provider batch job always needs the key
    return LLM(model=job.model, message_format=job.provider, base_url=job.base_url or None)


def _on_job(job_file: Path, action: Callable[[LLM, BatchJob], Awaitable[T]]) -> tuple[BatchJob, T]:
    """Load the job, run ``action`` with a client for its provider, save the job it updated;
    the job and what ``action`` returned."""

    async def work() -> tuple[BatchJob, T]:
        handle = _load(job_file)
        async with _client(handle) as llm:
            result = await action(llm, handle)
        handle.save(job_file)
        return handle, result

    return _run(work)


def _print_status(job: BatchJob, status: BatchJobStatus) -> None:
    click.echo(f"{job.provider} job, model {job.model}: {status}")
    for batch in job.batches:
        c = batch.counts
        line = f"  {batch.id:<40} {batch.state.value:<12} {c.succeeded}/{batch.count} ok"
        if batch.errors:
            line += "  " + "; ".join(batch.errors)[:120]
        click.echo(line)


@click.group()
def job() -> None:
    """Poll, fetch, cancel or resubmit a provider batch job saved with BatchJob.save()."""


@job.command()
@click.argument("job_file", type=JOB_FILE)
def status(job_file: Path) -> None:
    """Ask the provider how the job is doing (and update the job file).

    JOB_FILE is the job's handle, written by BatchJob.save().
    """

    handle, result = _on_job(job_file, lambda llm, job: llm.poll_batch(job))
    _print_status(handle, result)


@job.command()
@click.argument("job_file", type=JOB_FILE)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="JSONL file for the results; ids already in it are skipped.",
)
@click.option("--wait", is_flag=True, help="Poll until the job ends instead of refusing.")
@click.option(
    "--poll-interval",
    type=float,
    default=60.0,
    show_default=True,
    help="Seconds between polls with --wait.",
)
def fetch(job_file: Path, output: Path, wait: bool, poll_interval: float) -> None:
    """Write one result line per item; exit 1 if some items failed.

    Refuses while some of its batches are still running, unless --wait.

    JOB_FILE is the job's handle, written by BatchJob.save().
    """

    async def work() -> tuple[int, int]:
        handle = _load(job_file)
        async with _client(handle) as llm:
            current = await llm.poll_batch(handle)
            while wait and not current.state.is_terminal:
                await asyncio.sleep(poll_interval)
                current = await llm.poll_batch(handle)
            handle.save(job_file)
            from llm_kit.jsonl import append_results

            return await append_results(output, llm.fetch_batch_results(handle))

    written, failed = _run(work)
    click.echo(f"wrote {written} results to {output} ({written - failed} ok, {failed} failed)")
    if failed:
        sys.exit(1)


@job.command()
@click.argument("job_file", type=JOB_FILE)
def cancel(job_file: Path) -> None:
    """Stop every running batch of the job; finished requests stay fetchable.

    JOB_FILE is the job's handle, written by BatchJob.save().
    """

    handle, result = _on_job(job_file, lambda llm, job: llm.cancel_batch(job))
    _print_status(handle, result)


@job.command()
@click.argument("job_file", type=JOB_FILE)
def resubmit(job_file: Path) -> None:
    """Send again every item that failed for a retryable reason, as new batches of the job.

    JOB_FILE is the job's handle, written by BatchJob.save().
    """

    _, count = _on_job(job_file, lambda llm, job: llm.resubmit_failed(job))
    click.echo(f"resubmitted {count} items" if count else "nothing to resubmit")
