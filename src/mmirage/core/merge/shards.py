"""Merging published shards into one dataset, and the ``stats`` report.

A dataset's shards are what ``run`` publishes under its ``output_dir``: ``shard-<k>-of-<n>/``
(HF ``save_to_disk``), ``shard-<k>-of-<n>.parquet`` or ``shard-<k>-of-<n>.jsonl``, in any mix
(a shard published before ``output_format`` changed keeps its format). A merge checks that all
``n`` shards are there and refuses an incomplete set unless asked (``allow_partial``): a merged
file silently missing shards would look complete. Rows are written in shard
order and file order, which is the source order (shards are contiguous). ``merge_dir`` also
accepts the reference pipeline's ``shard_<k>/`` directories, so its outputs can be merged too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.core.shard.published import is_current, outdated_hint, repair_hint
from mmirage.core.shard.remote_output import output_folder, shard_output, upload_merged
from mmirage.core.shard.state import SUCCESS, read_status, shard_state
from mmirage.core.writer.formats import (
    Format,
    FormatError,
    format_of,
    iter_rows,
    target_path,
    write_dataset,
)
from mmirage.errors import UserError, WorkFailed
from mmirage.rundir import ERRORS, USAGE, RunDir
from mmirage.storage import is_url

if TYPE_CHECKING:
    from mmirage.config.loading_params import DatasetConfig, LoadingParams
    from mmirage.config.models import MMirageConfig

_FILE = re.compile(r"^shard-(\d+)-of-(\d+)\.(jsonl|parquet)$")
_HF_DIR = re.compile(r"^shard-(\d+)-of-(\d+)$|^shard_(\d+)$")


class MergeError(WorkFailed):
    """The shards cannot be merged as asked; ``str(err)`` is one sentence saying what to do."""


class NoShardsError(MergeError, UserError):
    """The path given holds no shards: the user must name another (exit 2)."""


class IncompleteShardsError(MergeError):
    def __init__(self, name: str, missing: list[int], num_shards: int, hint: str) -> None:
        self.missing = missing
        ids = ", ".join(map(str, missing))
        super().__init__(
            f"{name}: {len(missing)} of {num_shards} shard(s) are not published (shard id(s) "
            f"{ids}); {hint}, or pass --allow-partial to merge the others"
        )


@dataclass(frozen=True)
class ShardFile:
    shard_id: int
    path: Path

    @property
    def kind(self) -> Format:
        return format_of(self.path)

    def batches(self) -> Iterator[list[dict[str, Any]]]:
        return iter_rows(self.path)


@dataclass
class MergeResult:
    name: str
    output: str
    format: str
    shards: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    rows: int = 0
    rows_failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    json_columns: list[str] = field(default_factory=list)

    def count(self, batch: list[dict[str, Any]]) -> None:
        for row in batch:
            self.rows += 1
            self.rows_failed += bool(row.get(ERRORS))
            usage = row.get(USAGE)
            if isinstance(usage, Mapping):
                self.input_tokens += int(usage.get("input_tokens") or 0)
                self.output_tokens += int(usage.get("output_tokens") or 0)


def config_shards(lp: LoadingParams, dataset: DatasetConfig) -> tuple[list[ShardFile], list[int]]:
    """The published shards of one dataset of the config (in ``output_format`` when a shard
    exists in several; from object storage, downloaded), and the missing shard ids."""
    found: list[ShardFile] = []
    missing: list[int] = []
    for k in range(lp.num_shards):
        path = shard_output(lp, dataset, k).local_copy()
        if path is None:
            missing.append(k)
        else:
            found.append(ShardFile(k, path))
    return found, missing


def dir_shards(directory: Path) -> tuple[list[ShardFile], list[int], int]:
    """Shards found directly in ``directory``: (shards, missing ids, num_shards).

    A file (JSONL, then Parquet) wins over an HF directory of the same shard. The original's
    ``shard_<k>`` names carry no shard count: the set is taken as complete up to the highest id
    seen."""
    by_id: dict[int, ShardFile] = {}
    counts: set[int] = set()
    for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
        if entry.name.startswith(".") or ".tmp" in entry.name:
            continue
        if entry.is_file() and (m := _FILE.match(entry.name)):
            k, n = int(m[1]), int(m[2])
            counts.add(n)
            if k not in by_id or by_id[k].kind == "hf":
                by_id[k] = ShardFile(k, entry)
        elif entry.is_dir() and (m := _HF_DIR.match(entry.name)):
            k = int(m[1] if m[1] is not None else m[3])
            if m[2] is not None:
                counts.add(int(m[2]))
            by_id.setdefault(k, ShardFile(k, entry))
    if len(counts) > 1:
        raise MergeError(
            f"{directory} holds shards of different runs (num_shards {sorted(counts)}); "
            "move one run's shards elsewhere"
        )
    num_shards = counts.pop() if counts else (max(by_id) + 1 if by_id else 0)
    missing = [k for k in range(num_shards) if k not in by_id]
    return [by_id[k] for k in sorted(by_id)], missing, num_shards


def _check_target(dest: Path, inputs: list[Path]) -> None:
    # Never write over (or above) the shards being read: a failed merge would lose them.
    d = dest.resolve()
    for source in inputs:
        s = source.resolve()
        if d == s or d in s.parents:
            raise MergeError(f"unsafe merge output {dest}: it holds the input {source}")


def merge_shards(
    name: str, shards: list[ShardFile], base: Path, fmt: Format, missing: list[int] | None = None
) -> MergeResult:
    """Write ``shards`` (in shard-id order) to ``target_path(base, fmt)``."""
    shards = sorted(shards, key=lambda s: s.shard_id)
    dest = target_path(base, fmt)
    _check_target(dest, [s.path for s in shards])
    result = MergeResult(name, str(dest), fmt, [s.shard_id for s in shards], list(missing or []))

    counting = [True]  # the Arrow formats read twice: count rows on one pass only

    def batches() -> Iterator[list[dict[str, Any]]]:
        first = counting[0]
        counting[0] = False
        for shard in shards:
            for batch in shard.batches():
                if first:
                    result.count(batch)
                yield batch

    try:
        schema = write_dataset(batches, dest, fmt)
    except FormatError as exc:
        raise MergeError(f"{name}: {exc}") from None
    if schema is not None:
        result.json_columns = schema.json_columns
    return result


def _output_bases(config: MMirageConfig, output_root: Path | None) -> list[tuple[str, Path]]:
    """(name, base path) per dataset: ``<output_dir>/merged``, or with a root the original's
    ``<root>/<basename(output_dir)>`` (``_<i>`` added on a clash, ``dataset_<i>`` if empty)."""
    bases: list[tuple[str, Path]] = []
    used: set[str] = set()
    lp = config.loading_params
    for i, ds in enumerate(lp.datasets):
        out = Path(os.path.expanduser(ds.output_dir))
        if output_root is None:
            # On object storage: merged beside the mirror's part files, then uploaded.
            bases.append((ds.output_dir, output_folder(lp, ds) / "merged"))
            continue
        name = out.name or f"dataset_{i}"
        if name in used:
            name = f"{name}_{i}"
        used.add(name)
        bases.append((str(out), Path(os.path.expanduser(output_root)) / name))
    return bases


def merge_config(
    config: MMirageConfig,
    run_dir: RunDir,
    *,
    output_root: Path | None = None,
    fmt: Format = "hf",
    allow_partial: bool = False,
) -> list[MergeResult]:
    """Merge every dataset of the config. All completeness checks happen before any write:
    a damaged shard, or one computed under another configuration, is refused."""
    lp = config.loading_params
    n = lp.num_shards
    plans = []
    for ds, (name, base) in zip(lp.datasets, _output_bases(config, output_root), strict=True):
        shards, missing = config_shards(lp, ds)
        for shard in shards:  # merge reads every file anyway: the checksum costs one pass
            out = shard_output(lp, ds, shard.shard_id)
            if (damage := out.damage(full=True)) is not None:
                raise MergeError(f"{damage}; {repair_hint(shard.shard_id)}")
            if not is_current(out, run_dir.fingerprint):
                hint = outdated_hint(config.config_path or "CONFIG")
                raise MergeError(f"{ds.output_dir}: shard {shard.shard_id} {hint}, then merge")
        if missing and not allow_partial:
            raise IncompleteShardsError(
                name, missing, n, "run them with 'mmirage run CONFIG' (or --shard-id K)"
            )
        plans.append((ds, name, shards, base, missing))
    results = []
    for ds, name, s, base, missing in plans:
        result = merge_shards(name, s, base, fmt, missing)
        if output_root is None and is_url(ds.output_dir):
            result.output = upload_merged(ds, Path(result.output))
        results.append(result)
    return results


def merge_dir(
    directory: Path, output: Path | None = None, fmt: Format = "hf", allow_partial: bool = False
) -> list[MergeResult]:
    """Merge the shards found in ``directory`` to ``output`` (default ``<directory>/merged``);
    if it holds none but its subdirectories do, each becomes ``<output>/<subdir>``."""
    if not directory.is_dir():
        raise NoShardsError(f"{directory} is not a directory")
    shards, missing, n = dir_shards(directory)
    jobs: list[tuple[Path, list[ShardFile], list[int], int, Path]] = []
    if shards:
        jobs.append((directory, shards, missing, n, output or directory / "merged"))
    else:
        root = output or directory / "merged"
        for sub in sorted(p for p in directory.iterdir() if p.is_dir()):
            s, m, k = dir_shards(sub)
            if s:
                jobs.append((sub, s, m, k, root / sub.name))
    if not jobs:
        raise NoShardsError(
            f"no shards in {directory} (looked for shard-K-of-N.jsonl or .parquet files and "
            "shard directories, there and one level down)"
        )
    for where, _, m, k, _ in jobs:
        if m and not allow_partial:
            raise IncompleteShardsError(str(where), m, k, "add the missing shard files")
    return [merge_shards(str(where), s, base, fmt, m) for where, s, m, _, base in jobs]


# --- stats -----------------------------------------------------------------------------------


def human_seconds(seconds: float | None) -> str | None:
    """Like the original's humanize.precisedelta: "1 hour, 2 minutes and 5.20 seconds"."""
    if seconds is None:
        return None
    whole = int(seconds)
    h, m, s = whole // 3600, whole % 3600 // 60, seconds - whole // 60 * 60

    def unit(value: int, word: str) -> str:
        return f"{value} {word}{'' if value == 1 else 's'}"

    parts = [unit(h, "hour")] if h else []
    parts += [unit(m, "minute")] if m else []
    parts.append(f"{s:.2f} seconds")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _timestamp(text: Any) -> float | None:
    try:
        moment = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return (moment if moment.tzinfo else moment.astimezone()).timestamp()


def _rate(num: float, den: float | None) -> float | None:
    return round(num / den, 3) if den else None


def _tokens_unknown(entry: dict[str, Any]) -> None:
    for counters in (entry, entry.get("stats"), *entry["published"]):
        if isinstance(counters, dict):
            for key in ("input_tokens", "output_tokens"):
                if key in counters:
                    counters[key] = None


def stats_report(config: MMirageConfig, run_dir: RunDir) -> dict[str, Any]:
    """The original's ``{"per_shard": [...], "aggregate": {...}}`` from status.json files and
    the published shards. ``per_shard`` holds each status dict plus ``state`` (with stale and
    exhausted detection) and ``published`` (rows counted per dataset from the shard files).
    GPU fields are null: nothing here measures GPUs."""
    from mmirage.core.shard.live_counters import aggregate_json, summed

    lp = config.loading_params
    n = lp.num_shards
    # A batch_api output's tokens are known only to the merge of its results: null, not 0.
    batch = config.uses_batch_api
    per_shard: list[dict[str, Any]] = []
    for k in range(n):
        status = read_status(run_dir.status_path(k))
        entry: dict[str, Any] = dict(status or {})
        entry.setdefault("shard_id", k)
        entry["state"] = shard_state(status, config.execution_params.max_retries)
        published = []
        for ds in lp.datasets:
            ckpt = shard_output(lp, ds, k).finished()
            published.append(
                {"output_dir": ds.output_dir, **(asdict(ckpt) if ckpt else {"complete": False})}
            )
        entry["published"] = published
        if batch:
            _tokens_unknown(entry)
        per_shard.append(entry)

    done = [e for e in per_shard if e["state"] == SUCCESS and isinstance(e.get("stats"), dict)]
    runtimes = [float(e["stats"].get("runtime_seconds") or 0.0) for e in done]
    rows = sum(int(e["stats"].get("rows_processed") or 0) for e in done)
    starts = [t for e in done if (t := _timestamp(e.get("started_at"))) is not None]
    ends = [t for e in done if (t := _timestamp(e.get("finished_at"))) is not None]
    wall = round(max(ends) - min(starts), 3) if starts and ends else None

    def total(key: str) -> int:
        # From the published files: what a merge would hold, resumed attempts included.
        return sum(int(p.get(key) or 0) for e in per_shard for p in e["published"])

    sum_runtime = round(sum(runtimes), 3)
    out_tokens = total("output_tokens")
    aggregate: dict[str, Any] = {
        "total_shards": n,
        "completed_shards": len(done),
        "published_shards": sum(all(p["complete"] for p in e["published"]) for e in per_shard),
        "total_rows_processed": rows,
        "total_rows": total("rows_done"),
        "total_rows_failed": total("rows_failed"),
        # Failed rows split: 'mmirage retry' runs the retryable ones again (rate limit, server
        # error, timeout); the others failed for good (validation, truncated, refused…).
        "total_rows_retryable": total("rows_retryable"),
        "total_rows_failed_for_good": max(0, total("rows_failed") - total("rows_retryable")),
        "wall_clock_runtime_seconds": wall,
        "wall_clock_runtime_human": human_seconds(wall),
        "sum_shard_runtime_seconds": sum_runtime,
        "sum_shard_runtime_human": human_seconds(sum_runtime),
        "min_shard_runtime_seconds": min(runtimes) if runtimes else None,
        "min_shard_runtime_human": human_seconds(min(runtimes)) if runtimes else None,
        "max_shard_runtime_seconds": max(runtimes) if runtimes else None,
        "max_shard_runtime_human": human_seconds(max(runtimes)) if runtimes else None,
        "overall_throughput_rows_per_sec": _rate(rows, sum_runtime),
        "mean_gpu_util_pct": None,
        "num_gpus": None,
        "total_input_tokens": None if batch else total("input_tokens"),
        "total_output_tokens": None if batch else out_tokens,
        "sum_model_load_seconds": None,
        "sum_inference_runtime_seconds": sum_runtime,
        "output_tokens_per_sec": None if batch else _rate(out_tokens, sum_runtime),
        "tokens_per_sec_per_gpu": None,
        "gpu_days_per_billion_tokens": None,
        # Live requests: retries by cause, cool-down after rate limits, cost at live prices.
        **aggregate_json(summed(e["stats"].get("requests") for e in done)),
    }
    return {"per_shard": per_shard, "aggregate": aggregate}
