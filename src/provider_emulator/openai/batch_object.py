"""The Batch object (GET /v1/batches/{id}) as it stands at a moment of a job's life."""

from __future__ import annotations

from typing import Any

from provider_emulator.batch.job import BatchJob, Outcome, Phase

WINDOW_S = 24 * 3600
_STATUS = {
    Phase.VALIDATING: "validating",
    Phase.RUNNING: "in_progress",
    Phase.FINALIZING: "finalizing",
    Phase.CANCELLING: "cancelling",
}


def batch_json(job: BatchJob, now: float, *, initial: bool = False) -> dict[str, Any]:
    """The Batch object as it stands at ``now``; ``initial``: as the create call answers it."""
    phase = Phase.VALIDATING if initial else job.phase(now)
    outcome = job.outcome if phase is Phase.ENDED else None
    stamp: dict[str, float | None] = dict.fromkeys(
        ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
    )
    if phase is not Phase.VALIDATING and outcome is not Outcome.FAILED:
        left_validation = job.cancel_at is None or job.cancel_at >= job.running_since
        stamp["in_progress"] = job.running_since if left_validation else None
    if phase is Phase.FINALIZING or outcome is Outcome.COMPLETED:
        stamp["finalizing"] = min(job.finalizing_since, job.ended_at or now)
    if outcome is not None:
        stamp[outcome.value] = job.ended_at
    if job.cancel_at is not None and phase in (Phase.CANCELLING, Phase.ENDED):
        stamp["cancelling"] = job.cancel_at
    return {
        "id": job.id,
        "object": "batch",
        "endpoint": job.options["endpoint"],
        "model": job.options.get("model"),
        "errors": {"object": "list", "data": job.errors} if outcome and job.errors else None,
        "input_file_id": job.options["input_file_id"],
        "completion_window": "24h",
        "status": outcome.value if outcome else _STATUS[phase],
        "output_file_id": _file_id(job, "output", outcome),
        "error_file_id": _file_id(job, "error", outcome),
        "created_at": int(job.created_at),
        **{f"{name}_at": None if t is None else int(t) for name, t in stamp.items()},
        "expires_at": int(job.created_at + WINDOW_S),
        "request_counts": _counts(job, phase, outcome),
        "usage": _usage(job) if outcome else None,
        "metadata": job.options.get("metadata"),
    }


def _file_id(job: BatchJob, role: str, outcome: Outcome | None) -> str | None:
    file = job.outputs.get(role) if outcome is not None else None
    return None if file is None else file.id


def _counts(job: BatchJob, phase: Phase, outcome: Outcome | None) -> dict[str, int]:
    if phase is Phase.VALIDATING or outcome is Outcome.FAILED:
        return {"total": 0, "completed": 0, "failed": 0}
    failed = job.errored + (job.canceled + job.expired if outcome else 0)
    return {"total": job.total, "completed": job.succeeded, "failed": failed}


def _usage(job: BatchJob) -> dict[str, Any]:
    return {
        "input_tokens": job.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": job.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": job.input_tokens + job.output_tokens,
    }
