"""What a run needs before any shard starts, or any SLURM job is submitted: the processors'
keys, writable state, output and receipt folders, readable datasets and image folders.

Local runs and SLURM submissions check the same things with the same sentences: a task that
waited in the queue should not be the first to find a missing file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from mmirage.errors import UserError
from mmirage.rundir import RunDir

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig


def check_before_run(cfg: MMirageConfig, run_dir: RunDir) -> None:
    """Every key, folder and dataset the run needs (a ``UserError`` naming the first missing)."""
    from mmirage.core.loader import open_datasets
    from mmirage.core.process.preflight import check_credentials

    check_credentials(cfg)
    check_dirs(cfg, run_dir)
    open_datasets(cfg.loading_params.datasets, cfg.config_path)
    for index, ds in enumerate(cfg.loading_params.datasets):
        base = ds.image_base_path
        if base and not os.path.isdir(os.path.expanduser(base)):
            raise UserError(
                f"{cfg.config_path or 'the config'}: loading_params.datasets[{index}]."
                f"image_base_path = {base!r} is not a folder; fix the path (the rows' image "
                "paths are read relative to it)"
            )


def check_dirs(cfg: MMirageConfig, run_dir: RunDir) -> None:
    """The state, output and receipt folders, writable (``UserError`` otherwise)."""
    from mmirage.core.shard.remote_output import output_folder
    from mmirage.core.shard.state import ensure_writable_dir

    lp = cfg.loading_params
    ensure_writable_dir(run_dir.state, "loading_params.state_dir")
    for index, ds in enumerate(lp.datasets):
        where = f"loading_params.datasets[{index}].output_dir"
        # On object storage: the part files live in the URL's mirror under state_dir.
        ensure_writable_dir(output_folder(lp, ds) / ".parts", where)
    if cfg.uses_batch_api:
        # Receipts are written after the provider accepted a batch: their folder must be
        # usable before anything is sent.
        for index, processor in enumerate(cfg.processors):
            if (key := processor.name or processor.type) in run_dir.receipt_bases:
                base = Path(run_dir.receipt_base(key))
                ensure_writable_dir(base.parent, f"processors[{index}].metadata_output_path")


__all__ = ["check_before_run", "check_dirs"]
