"""A job's spool (its request files on disk) goes once nothing of it can be needed again.

The spool serves three readers: the uploads (``create_batches``), the adoption of a batch an
interrupted creation left at the provider (``adopt_orphans`` reads the chunk's file), and
``resubmit_failed`` without ``items`` (it copies the failed items' request lines). So after a
complete fetch (every item's result handed over) the spool keeps exactly the request lines of
the items whose result is a retryable failure, the ones ``resubmit_failed`` may send again,
and nothing else; with none left, the folder goes too. Nothing is removed while a creation is
unanswered (``job.intents``), nor when the job was submitted with ``keep_spool=True``.

Only the files llm_kit wrote are removed (``requests-*.jsonl``, ``retry-*/requests-*.jsonl``):
a ``spool_dir`` you named keeps anything else you put there.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import orjson

from llm_kit.batch.job import BatchJob
from llm_kit.types import BatchResult

logger = logging.getLogger(__name__)

REQUEST_FILES = "requests-*.jsonl"


class RetryableSeen:
    """The positions whose result was a retryable failure, one byte per item of the job."""

    def __init__(self, job: BatchJob) -> None:
        self.flags = bytearray(len(job.item_ids))
        self.complete = False  # every result went out: the consumer did not stop early

    async def watch(
        self, outcomes: AsyncIterator[tuple[int, BatchResult]]
    ) -> AsyncIterator[BatchResult]:
        """The results of ``outcomes``, noting the retryable failures on the way."""
        async for index, result in outcomes:
            if not result.ok and result.retryable:
                self.flags[index] = 1
            yield result
        self.complete = True


def prune(job: BatchJob, seen: RetryableSeen) -> None:
    """Cut the spool of ``job`` down to the request lines of its retryable failures, after a
    complete fetch (see the module's docstring for what stays)."""
    if job.keep_spool or job.intents or not seen.complete or not job.spool_dir:
        return
    root = Path(job.spool_dir)
    if not root.is_dir():
        return
    for retry in root.glob("retry-*"):  # resubmissions' uploads: their lines are also above
        if retry.is_dir():
            remove_all(retry)
    kept = 0
    files = sorted(root.glob(REQUEST_FILES))
    # requests-<n>-<first position>.jsonl holds positions from its first up to the next
    # file's first: a file with no retryable failure among them goes without being read.
    firsts = [_first_position(path) for path in files] + [len(seen.flags)]
    for path, first, end in zip(files, firsts, firsts[1:], strict=False):
        if 1 in seen.flags[first:end]:
            kept += _filter(path, seen.flags)
        else:
            path.unlink(missing_ok=True)
    _remove_if_empty(root)
    if kept:
        logger.info("kept the requests of %d retryable failure(s) in %s", kept, root)


def _first_position(path: Path) -> int:
    try:
        return int(path.stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return 0  # not a name of ours: read it, keeping what is needed


def remove_all(folder: Path) -> None:
    for path in folder.glob(REQUEST_FILES):
        path.unlink(missing_ok=True)
    _remove_if_empty(folder)


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: kept lines, or files that are not ours
        folder.rmdir()


def _filter(path: Path, keep: bytearray) -> int:
    """Keep only the lines of ``path`` whose position is flagged; remove the file if none
    is. Rewritten through a temporary file and a rename: a crash leaves one or the other."""
    tmp = path.with_name(path.name + ".tmp")
    kept = 0
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        for line in src:
            record = orjson.loads(line)
            index = int(record.get("custom_id", record.get("key")))
            if 0 <= index < len(keep) and keep[index]:
                dst.write(line)
                kept += 1
    if kept:
        os.replace(tmp, path)
    else:
        tmp.unlink()
        path.unlink()
    return kept
