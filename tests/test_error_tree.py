"""Every exception mmirage defines derives from ``mmirage.errors.MmirageError``, and its branch
(``UserError``: exit 2, ``WorkFailed``: exit 1) matches what the CLI has always done with it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import mmirage
from mmirage.errors import MmirageError, UserError, WorkFailed

# A BaseException on purpose: user code's `except Exception` must not swallow the alarm.
NOT_AN_ERROR = {"mmirage.core.process.custom_processor._CallTimeout"}


def _defined_exceptions() -> list[type[BaseException]]:
    found = []
    for info in pkgutil.walk_packages(mmirage.__path__, "mmirage."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                found.append(value)
    return found


def test_every_mmirage_exception_derives_from_mmirage_error() -> None:
    classes = _defined_exceptions()
    assert len(classes) >= 20
    names = {f"{c.__module__}.{c.__qualname__}": c for c in classes}
    strays = [
        n for n, c in names.items() if not issubclass(c, MmirageError) and n not in NOT_AN_ERROR
    ]
    assert strays == []


@pytest.mark.parametrize(
    ("where", "name", "branch"),
    [
        ("mmirage.config", "ConfigError", UserError),
        ("mmirage.core.loader", "DataError", UserError),
        ("mmirage.core.shard.state", "UnusableDirError", UserError),
        ("mmirage.core.process.batch.adapter", "MissingCredentialsError", UserError),
        ("mmirage.core.process.batch.registry", "UnknownBatchAdapterError", UserError),
        ("mmirage.core.process.batch.spool", "OversizedRequestError", UserError),
        ("mmirage.core.process.batch.cost", "PriceFileError", UserError),
        ("mmirage.core.process.batch.errors", "CollectorSetupError", UserError),
        ("mmirage.executors.slurm_client", "SlurmRejectedError", UserError),
        ("mmirage.core.shard.state", "ShardConflictError", WorkFailed),
        ("mmirage.core.merge.shards", "MergeError", WorkFailed),
        ("mmirage.core.process.batch.errors", "CollectorError", WorkFailed),
        ("mmirage.executors.slurm_client", "SlurmUnavailableError", WorkFailed),
    ],
)
def test_each_error_keeps_its_name_and_sits_on_its_branch(
    where: str, name: str, branch: type[MmirageError]
) -> None:
    cls = getattr(importlib.import_module(where), name)
    assert issubclass(cls, branch)


def test_the_builtin_bases_are_kept_for_callers_that_catch_them() -> None:
    from mmirage.config import ConfigError
    from mmirage.core.process.batch.adapter import MissingCredentialsError
    from mmirage.core.process.batch.registry import UnknownBatchAdapterError

    assert issubclass(ConfigError, ValueError)
    assert issubclass(MissingCredentialsError, RuntimeError)
    assert issubclass(UnknownBatchAdapterError, LookupError)
