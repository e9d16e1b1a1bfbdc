"""The run directory's contract: where every file of a pipeline lives, and what names mean.

Every module that reads or writes the run's files takes its paths, identities and column
names from here, so the layout is stated once. This module imports no other mmirage module
(the config type only for annotations): anything may import it. A command builds the run
value ``RunDir.of(config)`` once (the pipeline id and fingerprint are digests of the config)
and hands it down.

Layout, under ``loading_params.state_dir``::

    <pipeline id>/                       RunDir.state
        shard_<k>/status.json            status_path (lifecycle: core/shard/state.py)
        shard_<k>/lock                   shard_lock_path: held while a run has the shard
        batch/<processor>/shard-<k>-of-<n>/   batch spools of a batch_api processor
        batch/results.sqlite             the results store merge reads
        batch/retry.lock                 one batch resubmission at a time
        batch_metadata.<modality>.<run id>.jsonl   receipts, without a metadata_output_path
        answers/shard-<k>-of-<n>.log     answers_dir: every answer the shard paid for, as it
        answers/shard-<k>-of-<n>.sqlite  came (log), folded into an index by the next run
        batch-dry-run/...                the spools of a --dry-run
        slurm/                           job scripts and submissions (mode: slurm)

Under each dataset's ``output_dir``::

    .parts/shard-<k>-of-<n>.jsonl        the part file rows are appended to
    .parts/shard-<k>-of-<n>.ckpt.json    its checkpoint
    shard-<k>-of-<n>[.jsonl|.parquet|/]  the published shard
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.config.loading_params import HUB_OPTIONS
from mmirage.config.reserved import ERRORS, RETRY, ROW_KEY, USAGE, VARS
from mmirage.storage import is_url

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig


# A batch_api output's value until merge replaces it: this prefix, then the request's id.
PLACEHOLDER_PREFIX = "__BATCH_SUBMITTED__:"

# The counters status.json and the checkpoints keep. rows_retryable: failed rows whose every
# failure a retry may fix (``mmirage retry`` reruns them).
COUNTERS = ("rows_done", "rows_failed", "rows_retryable", "input_tokens", "output_tokens")


# -- time ------------------------------------------------------------------------------------


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def parse_iso(text: Any) -> float | None:
    try:
        moment = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    if moment.tzinfo is None:  # files written by older versions hold naive local times
        moment = moment.astimezone()
    return moment.timestamp()


# -- atomic writes ---------------------------------------------------------------------------


def atomic_write_json(path: Path, data: Any) -> None:
    """Write ``path`` so that a reader sees the old or the new content, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True, default=str)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written copy would only take more space
        raise


# -- pipeline identity -----------------------------------------------------------------------


def plain_config(value: Any) -> Any:
    """A config value as JSON-able data (dataclass init fields only: no derived objects)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = dataclasses.fields(value)
        return {f.name: plain_config(getattr(value, f.name)) for f in fields if f.init}
    if isinstance(value, Mapping):
        return {str(k): plain_config(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_config(v) for v in value]
    return value


def _digest(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _absolute(output_dir: str) -> str:
    # A URL names the same place from any working directory already.
    if is_url(output_dir):
        return output_dir.rstrip("/")
    return os.path.abspath(os.path.expanduser(output_dir))


def pipeline_id(config: MMirageConfig) -> str:
    """A hash of the datasets' output dirs and ``num_shards``: two pipelines sharing a
    ``state_dir`` keep apart."""
    lp = config.loading_params
    dirs = [_absolute(d.output_dir) for d in lp.datasets]
    return f"pipeline-{_digest([dirs, lp.num_shards])}"


# Processor fields that change how rows are computed, not what comes out: pacing, retries,
# timeouts, pools, chunking and bookkeeping. Everything else (model, server, sampling, script,
# function, fallback...) is part of the fingerprint.
_OPERATIONAL = frozenset(
    {
        "name",
        "rpm",
        "tpm",
        "worker_concurrency",
        "input_buffer_size",
        "max_retries",
        "request_timeout",
        "timeout_ms",
        "max_timeouts",
        "max_errors",
        "max_workers",
        "start_method",
        "max_chunk_bytes",
        "max_requests_per_chunk",
        "metadata_output_path",
        "oversized_request_policy",
        "completion_window",
        "timeout_seconds",
        "metadata",
        "price_per_mtok",
        "api_key_env",  # which variable holds the key: the same answers, and old fingerprints
        "engine_python",  # which interpreter runs the same engine and model
    }
)


def results_relevant(value: Any) -> Any:
    """A processor's ``plain_config`` less the fields that change how, not what, it computes."""
    if isinstance(value, dict):
        return {k: results_relevant(v) for k, v in value.items() if k not in _OPERATIONAL}
    return value


def _dataset_identity(dataset: Any) -> dict[str, Any]:
    """A dataset entry as fingerprinted: the hub options count only when set, so that a
    config written before they existed keeps its fingerprint (and its published shards)."""
    plain: dict[str, Any] = plain_config(dataset)
    # storage_options only names where credentials are: the same rows, whatever they say.
    plain.pop("storage_options", None)
    return {k: v for k, v in plain.items() if k not in HUB_OPTIONS or v not in (None, False)}


def fingerprint(config: MMirageConfig) -> str:
    """Changes when the rows a shard produces would change: inputs, outputs, schema, data and
    the processors' models, sampling and functions (not rpm, retries, SLURM...)."""
    pp, lp = config.processing_params, config.loading_params
    return _digest(
        {
            "inputs": plain_config(pp.inputs),
            "outputs": plain_config(pp.outputs),
            "output_schema": plain_config(pp.output_schema),
            "remove_columns": pp.remove_columns,
            "datasets": [_dataset_identity(d) for d in lp.datasets],
            "num_shards": lp.num_shards,
            "processors": [results_relevant(plain_config(p)) for p in config.processors],
        }
    )


# -- the run value: one pipeline's identity and paths under state_dir -----------------------


@dataclasses.dataclass(frozen=True)
class RunDir:
    """One pipeline's identity and the files under its state folder, worked out once per
    command from the config (``RunDir.of``) and handed down: code below ``cli/`` that needs a
    path or the pipeline's identity takes this value, not the config."""

    state: Path  # ``<state_dir>/<pipeline id>``
    pipeline_id: str
    fingerprint: str
    num_shards: int
    # Each batch_api processor's receipt base (``metadata_output_path`` less ``.jsonl``, or
    # ``<state>/batch_metadata``: a receipt must always land somewhere), by processor key.
    receipt_bases: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, config: MMirageConfig) -> RunDir:
        lp = config.loading_params
        pid = pipeline_id(config)
        state = Path(os.path.expanduser(lp.state_dir or ".")) / pid
        bases = {}
        for processor in config.processors:
            provider = getattr(processor, "provider_config", None)
            if provider is not None:  # a batch_api processor
                base = provider.metadata_output_path or str(state / "batch_metadata.jsonl")
                key = processor.name or processor.type
                bases[key] = os.path.expanduser(base).removesuffix(".jsonl")
        return cls(state, pid, fingerprint(config), lp.num_shards, bases)

    def shard_name(self, shard_id: int) -> str:
        return shard_name(shard_id, self.num_shards)

    def shard_dir(self, shard_id: int) -> Path:
        return self.state / f"shard_{shard_id}"

    def status_path(self, shard_id: int) -> Path:
        return self.shard_dir(shard_id) / "status.json"

    def shard_lock_path(self, shard_id: int) -> Path:
        """The lock one run of a shard holds (``core/shard/state.shard_lock``)."""
        return self.shard_dir(shard_id) / "lock"

    @property
    def answers_dir(self) -> Path:
        """Where each shard keeps every answer it paid for (``core/shard/answers.py``)."""
        return self.state / "answers"

    @property
    def slurm_dir(self) -> Path:
        """Job scripts and the record of every submission (``executors/slurm.py``)."""
        return self.state / "slurm"

    def batch_dir(self, *, dry_run: bool = False) -> Path:
        """Where batch_api processors keep spools, markers and the results store."""
        return self.state / ("batch-dry-run" if dry_run else "batch")

    def batch_spool_dir(self, processor: str, shard_id: int, *, dry_run: bool) -> Path:
        """One batch_api processor's spools for one shard."""
        return self.batch_dir(dry_run=dry_run) / processor / self.shard_name(shard_id)

    @property
    def results_store(self) -> Path:
        return self.batch_dir() / "results.sqlite"

    @property
    def retry_lock(self) -> Path:
        return self.batch_dir() / "retry.lock"

    def receipt_base(self, processor: str) -> str:
        """Where ``processor``'s receipts go: ``<base>.<modality>.<run_id>.jsonl``."""
        return self.receipt_bases.get(processor) or str(self.state / "batch_metadata")


# -- paths under a dataset's output_dir ------------------------------------------------------


def shard_name(shard_id: int, num_shards: int) -> str:
    return f"shard-{shard_id}-of-{num_shards}"


def part_path(output_dir: Path, name: str) -> Path:
    """The part file a shard's rows are appended to (``name``: ``shard_name``)."""
    return output_dir / ".parts" / f"{name}.jsonl"


def checkpoint_path(output_dir: Path, name: str) -> Path:
    return output_dir / ".parts" / f"{name}.ckpt.json"


def published_path(output_dir: Path, name: str, fmt: str) -> Path:
    """Where a shard is published in ``fmt`` (HF: a directory; else one file)."""
    return output_dir / (name if fmt == "hf" else f"{name}.{fmt}")


__all__ = [
    "COUNTERS",
    "ERRORS",
    "PLACEHOLDER_PREFIX",
    "RETRY",
    "ROW_KEY",
    "USAGE",
    "VARS",
    "RunDir",
    "atomic_write_json",
    "checkpoint_path",
    "fingerprint",
    "now_iso",
    "parse_iso",
    "part_path",
    "pipeline_id",
    "plain_config",
    "published_path",
    "results_relevant",
    "shard_name",
]
