"""A chunk's batch creation is recorded before it starts, and its receipt is never lost.

``chunk-000001.intent`` (beside the chunk's spool files) holds ``{"tag", "since"}`` (and
``chunk_id``, and for a retry's chunk ``retry_of``, so that a rerun can write the receipt of a
batch it adopts), written
and fsynced before the adapter is called: a chunk that has an intent but no ``.done`` was being
created when its run stopped (SIGKILL, a crash, a full disk). Its rerun asks the adapter for
the batch carrying the tag (``find_submitted_chunk``) and adopts it; only when the provider has
none is the chunk created, with the same tag. Built-in adapters tag OpenAI batches in their
metadata and Gemini batches in their display name, and find Anthropic batches, which carry no
tag, as ``llm_kit.batch.orphans`` describes; a custom adapter that does not implement
``find_submitted_chunk`` is created again (the window the intent cannot close for it).

``record_receipt`` writes the ``.done`` marker and the receipt line; a receipt that cannot be
written (ENOSPC, EACCES) is printed on stderr with its batch id before the error goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from mmirage.core.process.batch.receipts import append_receipt
from mmirage.core.process.batch.spool import SpooledChunk

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Intent:
    tag: str
    since: float  # Unix seconds, just before the creation started
    chunk_id: str = ""
    retry_of: tuple[str, ...] = ()  # a resubmitted chunk: the batches its requests came from


def intent_path(chunk: SpooledChunk) -> Path:
    return chunk.path.with_suffix(".intent")


def read_intent(chunk: SpooledChunk) -> Intent | None:
    """The chunk's recorded intent; None when there is none, or it is torn (a kill while it
    was written: the creation had not started then)."""
    try:
        data = orjson.loads(intent_path(chunk).read_bytes())
        origins = tuple(str(b) for b in data.get("retry_of") or ())
        chunk_id = str(data.get("chunk_id", ""))
        return Intent(str(data["tag"]), float(data["since"]), chunk_id, origins)
    except FileNotFoundError:
        return None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        logger.warning("%s is torn; the chunk had not been sent yet", intent_path(chunk))
        return None


def write_intent(chunk: SpooledChunk, chunk_id: str = "", retry_of: Sequence[str] = ()) -> Intent:
    """A new intent, durable (fsynced) before this returns."""
    intent = Intent(f"mmirage-{uuid.uuid4().hex}", time.time(), chunk_id, tuple(retry_of))
    path = intent_path(chunk)
    tmp = path.with_suffix(".intent.tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(dataclasses.asdict(intent)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return intent


def abandon_intent(chunk: SpooledChunk) -> None:
    """The provider has no batch of this intent: its chunk is never looked for again (a
    retry resubmits the chunk's requests in a chunk of its own)."""
    os.replace(intent_path(chunk), chunk.path.with_suffix(".abandoned"))


def recorded_batch_ids(batch_root: Path) -> set[str]:
    """Every batch id a ``.done`` marker under ``<state>/batch`` names (all processors and
    shards): batches that are some chunk's own, never adopted for another one."""
    ids: set[str] = set()
    for path in batch_root.glob("*/*/*/chunk-*.done"):
        try:
            ids.add(str(orjson.loads(path.read_bytes())["provider_batch_id"]))
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            continue
    return ids


def record_receipt(chunk: SpooledChunk, receipt: dict[str, Any], receipt_file: Path) -> None:
    """The ``.done`` marker (the spool folder: a rerun then knows the provider has this batch),
    then the receipt line and ``.receipted``. On an OSError the receipt goes to stderr, so its
    batch id is never lost, and the error is raised again."""
    try:
        _write_whole(chunk.done_path, orjson.dumps(receipt))
        append_receipt(receipt_file, receipt)
        chunk.receipted_path.touch()
    except OSError as exc:
        print_unsaved_receipt(receipt, exc)
        raise


def print_unsaved_receipt(receipt: dict[str, Any], exc: OSError) -> None:
    problem = f"{exc.strerror or exc} ({exc.filename})" if exc.filename else str(exc)
    sys.stderr.write(
        f"error: the {receipt.get('provider')} batch {receipt.get('provider_batch_id')} (chunk "
        f"{receipt.get('chunk_id')}) was created but its receipt could not be written: "
        f"{problem}; fix that and rerun (the rerun adopts this batch, it does not pay again). "
        f"The receipt: {orjson.dumps(receipt).decode()}\n"
    )
    sys.stderr.flush()


def _write_whole(path: Path, data: bytes) -> None:
    """``path`` holds all of ``data`` or does not exist (a torn ``.done`` would pass for a
    receipt): written aside, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
