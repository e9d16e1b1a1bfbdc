"""Batch jobs and their files, kept for as long as the emulator runs.

Files live on disk in a private temporary directory that is removed at shutdown: uploads are
streamed there and results are written and served from there, so a 200 MB input or a million
result lines never sit in memory. Jobs stay in memory, so a client that restarts can poll and
fetch them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any

from provider_emulator.batch.files import StoredFile
from provider_emulator.batch.job import BatchJob

__all__ = ["BatchStore", "StoredFile"]


class BatchStore:
    """Files by id and jobs by id (in creation order); touched only from the app's loop."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self.files: dict[str, StoredFile] = {}
        self.jobs: dict[str, BatchJob] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._serial = 0

    def new_path(self, stem: str) -> Path:
        """A fresh path in the store's directory (created on first use)."""
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="llm-kit-emulator-"))
        self._serial += 1
        return self._dir / f"{self._serial:08d}-{stem}"

    def add_file(self, file: StoredFile) -> StoredFile:
        self.files[file.id] = file
        return file

    def delete_file(self, file_id: str) -> bool:
        file = self.files.pop(file_id, None)
        if file is None:
            return False
        # A job reading this input keeps its open handle: unlinking does not disturb it.
        file.path.unlink(missing_ok=True)
        return True

    def add_job(self, job: BatchJob) -> None:
        self.jobs[job.id] = job

    def jobs_of(self, provider: str) -> list[BatchJob]:
        """The provider's jobs, newest first (the order every list endpoint uses)."""
        return [job for job in reversed(self.jobs.values()) if job.provider == provider]

    def delete_job(self, job_id: str) -> None:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        job.stop()
        for path in job.paths:
            path.unlink(missing_ok=True)

    def start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run a job's work in the background; the store keeps the task alive until it ends."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        """Stop every job's work and remove the directory (at shutdown)."""
        tasks: Iterable[asyncio.Task[None]] = list(self._tasks)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
