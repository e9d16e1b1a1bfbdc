"""Receipts: one JSON line per submitted chunk, in ``<base>.<modality>.<run_id>.jsonl``.

``<base>`` is ``metadata_output_path`` without ``.jsonl`` (the original's format), or
``<state folder>/batch_metadata`` when the path is empty (the original then lost its receipts).
Dry runs write ``<base>.dry-run.<modality>.<run_id>.jsonl``, which ``check`` and ``merge`` skip.

A receipt line keeps the original's keys (``provider``, ``chunk_id``, ``provider_batch_id``,
``status``, ``custom_id_to_source_index``, ``request_hash``, ``model_params_snapshot``,
``submitted_request_count``, ``total_bytes``, ``has_oversized_request``, ``flush_reason``,
``submitted_at_utc``) and adds what makes it unambiguous across shards and runs: ``run_id``,
``shard_id``, ``num_shards``, ``datasets``, ``processor``, ``outputs``, ``spool_path`` (the exact
request lines, kept for resubmission) and ``retry_of`` for resubmitted requests.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from mmirage.config.batch_provider import BatchProviderConfig
    from mmirage.config.models import MMirageConfig
    from mmirage.config.processors import BatchApiProcessorConfig

logger = logging.getLogger(__name__)

MODALITIES = ("text", "multimodal")
DRY_RUN = "dry-run"


def receipt_base(provider_config: BatchProviderConfig, state_dir: str) -> str:
    base = provider_config.metadata_output_path or os.path.join(state_dir, "batch_metadata.jsonl")
    base = os.path.expanduser(base)
    return base.removesuffix(".jsonl")


def receipt_path(base: str, modality: str, run_id: str, *, dry_run: bool = False) -> Path:
    middle = f"{DRY_RUN}.{modality}" if dry_run else modality
    return Path(f"{base}.{middle}.{run_id}.jsonl")


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


def config_receipt_globs(config: MMirageConfig, state_dir: str) -> list[str]:
    """The non-dry-run receipt globs of every batch_api processor of the config."""
    patterns: list[str] = []
    for processor in batch_processors(config):
        base = receipt_base(processor.provider_config, state_dir)
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
                yield Receipt(path, number, data)
