"""What a shard's Ray task takes from the driver's environment: the keys and endpoints its
processors and its datasets' object storage read there. A Ray node has its own environment
(that of ``ray start``), not the shell's that ran ``mmirage run``.

They travel as the task's arguments, held in Ray's memory for the task, and are set only while
the task runs: never in ``runtime_env`` (Ray keeps that in the job's record, which its dashboard
and logs show) and never in a file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from mmirage.storage import is_client_variable, is_url

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

# Variables providers read: OPENAI_API_KEY, AZURE_OPENAI_API_KEY, OPENAI_BASE_URL, ...
FORWARDED_SUFFIXES = ("_API_KEY", "_BASE_URL")


def forwarded_env(cfg: MMirageConfig) -> dict[str, str]:
    """The driver's variables a task of ``cfg`` needs: every ``*_API_KEY`` and ``*_BASE_URL``
    set here, each variable a processor names in ``api_key_env``, and for a dataset on object
    storage, those its ``storage_options`` name and its filesystem client's own (``AWS_*``...)."""
    named = {getattr(p, "api_key_env", None) for p in cfg.processors} - {None}
    urls: list[str] = []
    for dataset in cfg.loading_params.datasets:
        paths = dataset.path.values() if isinstance(dataset.path, dict) else [dataset.path]
        dataset_urls = [p for p in [*paths, dataset.output_dir] if is_url(p)]
        if dataset_urls:
            named.update((dataset.storage_options or {}).values())
        urls += dataset_urls
    return {
        name: value
        for name, value in os.environ.items()
        if value
        and (
            name in named
            or name.endswith(FORWARDED_SUFFIXES)
            or any(is_client_variable(url, name) for url in urls)
        )
    }


@contextlib.contextmanager
def task_env(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set in this worker's environment while the task runs, then put back: a Ray
    worker runs other tasks after this one."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
