"""Receipts rebuilt from the spool's ``.done`` markers, so a damaged receipt file strands
no paid-for batch.

Every submitted chunk keeps its receipt twice: as a line of ``<base>.<modality>.<run_id>.jsonl``
and as the chunk's ``.done`` marker in ``<state>/batch/…/<modality>/`` (written first). When
a receipt file was truncated or a line torn, the markers of its run and modality still name
every batch; ``check``, ``merge`` and ``retry`` read those markers after the files (the first
receipt of a batch wins, and both hold the same line). A receipt file that is gone altogether
is rebuilt the same way, with a warning naming its run: its batches were paid for, and
without it they could be reached by no command. (Receipt files named with ``--metadata-path``
are read alone: the markers are not consulted then.)
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import orjson

from mmirage.core.process.batch.receipts import MODALITIES

logger = logging.getLogger(__name__)

# <processor>/shard-k-of-n/<modality>/ and retry-<run>/<processor>/<modality>/ under <state>/batch
_MARKERS = "*/*/*/chunk-*.done"


def with_spooled_receipts(paths: Sequence[str], batch_dir: Path) -> list[str]:
    """``paths`` followed by every readable ``.done`` marker under ``batch_dir``
    (``RunDir.batch_dir``: this pipeline's alone), whether its receipt file lacks lines or is
    gone; a run whose receipt file is gone is named in a warning."""
    kept = {key for key in map(_run_of_file, paths) if key is not None}
    markers: list[str] = []
    lost: Counter[tuple[str, str]] = Counter()
    for marker in sorted(batch_dir.glob(_MARKERS)):
        run = _run_of_marker(marker)
        if run is None:
            continue
        markers.append(str(marker))
        if run not in kept:
            lost[run] += 1
    for (modality, run_id), count in sorted(lost.items()):
        logger.warning(
            "no %s receipt file of run %s was found (deleted or moved); its %d batch(es) are "
            "read from their chunk markers under %s instead: nothing needs submitting again",
            modality,
            run_id,
            count,
            batch_dir,
        )
    return [*paths, *markers]


def _run_of_file(path: str) -> tuple[str, str] | None:
    """``(modality, run_id)`` of ``<base>.<modality>.<run_id>.jsonl``."""
    parts = Path(path).name.split(".")
    if len(parts) >= 4 and parts[-1] == "jsonl" and parts[-3] in MODALITIES:
        return parts[-3], parts[-2]
    return None


def _run_of_marker(path: Path) -> tuple[str, str] | None:
    try:
        data = orjson.loads(path.read_bytes())
        snapshot = data.get("model_params_snapshot") or {}
        return str(snapshot.get("modality") or path.parent.name), str(data["run_id"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        logger.warning("%s is not a readable receipt; skipped", path)
        return None
