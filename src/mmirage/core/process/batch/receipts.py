"""Receipts: one JSON line per submitted chunk, in ``<base>.<modality>.<run_id>.jsonl``.

``<base>`` is ``metadata_output_path`` without ``.jsonl`` (the original's format), or
``<state folder>/batch_metadata`` when the path is empty (a receipt must always land somewhere:
without it a paid batch could not be merged).
Dry runs write ``<base>.dry-run.<modality>.<run_id>.jsonl``, which ``check`` and ``merge`` skip.

A receipt line keeps the original's keys (``provider``, ``chunk_id``, ``provider_batch_id``,
``status``, ``custom_id_to_source_index``, ``request_hash``, ``model_params_snapshot``,
``submitted_request_count``, ``total_bytes``, ``has_oversized_request``, ``flush_reason``,
``submitted_at_utc``) and adds what makes it unambiguous across shards and runs: ``run_id``,
``shard_id``, ``num_shards``, ``datasets``, ``processor``, ``outputs``, ``spool_path`` (the exact
request lines, kept for resubmission), ``retry_of`` for resubmitted requests, and the
``pipeline_id``, ``fingerprint`` and ``endpoint`` (provider and base URL, digested) that tell
``merge`` which configuration submitted them.
"""

from __future__ import annotations

import datetime as dt
import glob
import hashlib
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

# The one redactor of llm_kit, imported from here by the modules that write receipts.
from llm_kit.redact import redact as redact

if TYPE_CHECKING:
    from mmirage.config.batch_provider import BatchProviderConfig
    from mmirage.config.models import MMirageConfig
    from mmirage.config.processors import BatchApiProcessorConfig
    from mmirage.core.process.batch.spool import SpooledChunk
    from mmirage.rundir import RunDir

logger = logging.getLogger(__name__)

MODALITIES = ("text", "multimodal")
DRY_RUN = "dry-run"


def endpoint(provider_config: BatchProviderConfig) -> str:
    """Where a processor's requests go (provider and base URL), as a short digest: a receipt
    carries it (a base URL may hold a secret; its digest does not)."""
    where = f"{provider_config.provider}\0{getattr(provider_config, 'base_url', None) or ''}"
    return hashlib.blake2b(where.encode(), digest_size=8).hexdigest()


def receipt_path(base: str, modality: str, run_id: str, *, dry_run: bool = False) -> Path:
    middle = f"{DRY_RUN}.{modality}" if dry_run else modality
    return Path(f"{base}.{middle}.{run_id}.jsonl")


def chunk_receipt(
    provider_config: BatchProviderConfig,
    chunk: SpooledChunk,
    lines: list[bytes],
    ids: list[tuple[str, int, int]],
    *,
    chunk_id: str,
    batch_id: str,
    status: str,
    raw: dict[str, Any],
    modality: str | None,
    processor: str,
    run_id: str,
    shard_id: int | None,
    num_shards: int | None,
    pipeline_id: str = "",
    fingerprint: str = "",
) -> dict[str, Any]:
    """The receipt line of one submitted chunk (``lines``/``ids``: its request lines and
    ``(custom_id, source_index, dataset)``); see the module docstring for the keys."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line)
    return {
        "provider": provider_config.provider,
        "chunk_id": chunk_id,
        "provider_batch_id": batch_id,
        "status": status,
        "custom_id_to_source_index": {cid: index for cid, index, _ in ids},
        "request_hash": digest.hexdigest(),
        "model_params_snapshot": {
            "outputs": sorted({cid.rsplit("-", 2)[0] for cid, _, _ in ids}),
            "modality": modality,
            "model": getattr(provider_config, "model", None),
        },
        "submitted_request_count": len(lines),
        "total_bytes": chunk.bytes,
        "has_oversized_request": chunk.oversized,
        "flush_reason": chunk.flush_reason or "recovered",
        "submitted_at_utc": dt.datetime.now(dt.UTC).isoformat(),
        "run_id": run_id,
        "shard_id": shard_id,
        "num_shards": num_shards,
        "datasets": sorted({dataset for _, _, dataset in ids}),
        "processor": processor,
        # Which pipeline and configuration: merge ignores receipts of any other.
        "pipeline_id": pipeline_id,
        "fingerprint": fingerprint,
        "endpoint": endpoint(provider_config),
        # Absolute: retry may run from another working directory.
        "spool_path": str(chunk.path.resolve()),
        "raw_response": public_fields(raw),
    }


_SECRET_FIELDS = ("key", "token", "authorization", "secret", "password")


def public_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The provider's answer minus anything that could be a credential, at any depth."""
    cleaned: dict[str, Any] = _without_secret_fields(raw)
    return cleaned


def _without_secret_fields(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _without_secret_fields(v)
            for k, v in value.items()
            if not any(word in str(k).lower() for word in _SECRET_FIELDS)
        }
    if isinstance(value, list):
        return [_without_secret_fields(v) for v in value]
    return value


def append_receipt(path: Path, receipt: dict[str, Any]) -> None:
    """One line, one ``write`` (O_APPEND): shards of one run may share the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, orjson.dumps(receipt, option=orjson.OPT_APPEND_NEWLINE))
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Receipt:
    """One receipt line, as read back."""

    path: str
    line: int
    data: dict[str, Any]

    @property
    def provider(self) -> str:
        return str(self.data["provider"])

    @property
    def batch_id(self) -> str:
        return str(self.data["provider_batch_id"])

    @property
    def submitted_at(self) -> str:
        return str(self.data.get("submitted_at_utc") or "")

    @property
    def custom_ids(self) -> dict[str, int]:
        mapping: dict[str, int] = self.data.get("custom_id_to_source_index") or {}
        return mapping


def receipt_globs(run_dir: RunDir) -> list[str]:
    """The non-dry-run receipt globs of every batch_api processor of the pipeline."""
    patterns: list[str] = []
    for base in run_dir.receipt_bases.values():
        for modality in MODALITIES:
            pattern = f"{glob.escape(base)}.{modality}.*.jsonl"
            if pattern not in patterns:
                patterns.append(pattern)
    return patterns


def batch_processors(config: MMirageConfig) -> list[BatchApiProcessorConfig]:
    from mmirage.config.processors import BatchApiProcessorConfig

    return [p for p in config.processors if isinstance(p, BatchApiProcessorConfig)]


def resolve_receipt_paths(patterns: Iterable[str], explicit: Iterable[str] = ()) -> list[str]:
    """``explicit`` paths (``--metadata-path``) when given, else every file the globs match,
    oldest run first (by modification time, so later receipts win ties)."""
    given = [os.path.expanduser(p) for p in explicit]
    if given:
        missing = [p for p in given if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"no such receipt file: {missing[0]}")
        return given
    found = {p for pattern in patterns for p in glob.glob(pattern)}
    return sorted(found, key=lambda p: (os.path.getmtime(p), p))


def read_receipts(paths: Iterable[str]) -> Iterator[Receipt]:
    """Every usable line; malformed lines and dry-run receipts are skipped with a warning."""
    for path in paths:
        with open(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    data = orjson.loads(line)
                except orjson.JSONDecodeError:
                    logger.warning("%s:%d: not a JSON line; skipped", path, number)
                    continue
                if (
                    not isinstance(data, dict)
                    or not data.get("provider")
                    or not data.get("provider_batch_id")
                ):
                    logger.warning(
                        "%s:%d: lacks provider or provider_batch_id; skipped", path, number
                    )
                    continue
                if data.get("status") == "dry_run":
                    continue
                ids = data.get("custom_id_to_source_index") or {}
                if not isinstance(ids, dict) or not all(
                    isinstance(k, str) and isinstance(v, int) for k, v in ids.items()
                ):
                    logger.warning(
                        "%s:%d: custom_id_to_source_index is not a map of id to row; skipped",
                        path,
                        number,
                    )
                    continue
                yield Receipt(path, number, data)
