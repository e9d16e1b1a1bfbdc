"""``mmirage run --export-prompts``: the pipeline runs for real, but nothing is submitted.

A dry run must leave no trace that a real run would trust: its shard outputs, status and
spools go to a temporary folder (shards marked ``success`` by a dry run would make the real
run skip them and submit nothing). What it keeps is the export file and the
dry-run receipts, which stay where the real receipts go.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mmirage.config.errors import ConfigError
from mmirage.config.models import MMirageConfig
from mmirage.config.processors import BatchApiProcessorConfig
from mmirage.core.process.batch.receipts import batch_processors
from mmirage.rundir import RunDir


def check_dry_run_allowed(
    config: MMirageConfig, export_target: Path | None = None, given: str = ""
) -> None:
    """Raise ``ConfigError`` when ``--export-prompts`` cannot apply to this config, and
    ``UnusableDirError`` when ``export_target`` (from ``--export-prompts given``) cannot be
    written."""
    source = config.config_path or "<config>"
    if config.execution_params.mode != "local":
        raise ConfigError(
            source,
            "execution_params.mode",
            "--export-prompts runs only with mode: local (it writes one local file); "
            "set mode: local for the dry run",
        )
    if not batch_processors(config):
        raise ConfigError(
            source,
            "processors",
            "--export-prompts exports batch_api requests, and this config declares no "
            "batch_api processor",
        )
    if export_target is not None:
        check_export_target(export_target, given)


def check_export_target(target: Path, given: str) -> None:
    """Raise ``UnusableDirError`` (one sentence) when the export file ``target`` (from
    ``--export-prompts given``) cannot be written: checked before any shard runs, so a file in
    the way is the user's to fix, not a failed shard."""
    from mmirage.usable_dirs import UnusableDirError, ensure_writable_dir

    for blocking in [*reversed(target.parents), target]:
        if blocking == target and blocking.is_dir():
            raise UnusableDirError(
                f"--export-prompts {given}: {blocking} is a directory; move it away or choose "
                "another path"
            )
        if blocking != target and blocking.exists() and not blocking.is_dir():
            if blocking == target.parent and not given.endswith(".jsonl"):
                raise UnusableDirError(
                    f"--export-prompts {given}: {blocking} is a file, and a path that does not "
                    f"end in .jsonl names a directory (the export goes to {target.name} in "
                    "it); give a directory, or a file name ending in .jsonl"
                )
            raise UnusableDirError(
                f"--export-prompts {given}: {blocking} is a file, not a directory; move it "
                "away or choose another path"
            )
    ensure_writable_dir(target.parent, "--export-prompts")


def dry_run_config(config: MMirageConfig, run_dir: RunDir, workdir: Path) -> MMirageConfig:
    """``config`` with outputs and state under ``workdir``; receipts where the real run's
    (``run_dir``) go."""
    real_state = run_dir.state
    processors = [
        _with_receipts_at(p, real_state) if isinstance(p, BatchApiProcessorConfig) else p
        for p in config.processors
    ]
    lp = config.loading_params
    datasets = [
        dataclasses.replace(d, output_dir=str(workdir / f"dataset-{i}"))
        for i, d in enumerate(lp.datasets)
    ]
    # JSONL: publishing the throwaway shards is then a rename, not a conversion.
    loading = dataclasses.replace(
        lp, datasets=datasets, state_dir=str(workdir / "state"), output_format="jsonl"
    )
    return dataclasses.replace(config, processors=processors, loading_params=loading)


def _with_receipts_at(processor: BatchApiProcessorConfig, state: Path) -> BatchApiProcessorConfig:
    pc = processor.provider_config
    if pc.metadata_output_path:
        return processor
    moved = dataclasses.replace(pc, metadata_output_path=str(state / "batch_metadata.jsonl"))
    return dataclasses.replace(processor, provider_config=moved)
