"""A batch_api pipeline's provider batches: the receipts ``mmirage run`` wrote (read as
``check`` reads them), each with the status and result counts the results store holds from
the last ``check``/``merge``. Read only: the store is opened read-only, no provider is asked."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mmirage.core.process.batch.collector import receipt_files, scan_receipts
from mmirage.core.process.batch.errors import CollectorError

if TYPE_CHECKING:
    from mmirage.rundir import RunDir


@dataclass(frozen=True)
class BatchLine:
    provider: str
    batch_id: str
    processor: str
    submitted_at: str
    requests: int
    status: str  # as last polled, or "not polled yet"
    succeeded: int
    failed: int


def _store_counts(run_dir: RunDir) -> dict[str, tuple[str, int, int]]:
    """batch id → (status, succeeded, failed) from the results store, if there is one."""
    path = run_dir.results_store
    if not path.is_file():
        return {}
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return {}
    try:
        counts: dict[int, list[int]] = {}
        for no, ok, n in db.execute("SELECT batch_no, ok, count(*) FROM results GROUP BY 1, 2"):
            counts.setdefault(no, [0, 0])[0 if ok else 1] += n
        found = {}
        for batch_id, no, status in db.execute("SELECT batch_id, no, status FROM batches"):
            ok, failed = counts.get(no, [0, 0])
            found[str(batch_id)] = (str(status or "not polled yet"), ok, failed)
        return found
    except sqlite3.Error:
        return {}  # being written, or an older layout: the receipts alone
    finally:
        db.close()


def batch_lines(run_dir: RunDir) -> list[BatchLine]:
    try:
        scan = scan_receipts(receipt_files(run_dir))
    except (CollectorError, OSError):
        return []  # nothing submitted yet
    store = _store_counts(run_dir)
    lines = []
    for record in scan.records:
        status, ok, failed = store.get(record.batch_id, ("not polled yet", 0, 0))
        lines.append(
            BatchLine(
                provider=record.provider,
                batch_id=record.batch_id,
                processor=record.processor or "",
                submitted_at=record.submitted_at,
                requests=record.request_count,
                status=status,
                succeeded=ok,
                failed=failed,
            )
        )
    return lines
