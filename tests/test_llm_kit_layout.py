"""llm_kit's layout promises (issue 9): every exception in one module, the old import paths kept."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import llm_kit
import llm_kit.errors


def _llm_kit_modules() -> list[str]:
    names = [
        info.name
        for info in pkgutil.walk_packages(llm_kit.__path__, "llm_kit.")
        # The emulator is a test server with its own errors; the local engine needs llama_cpp.
        if not info.name.startswith(("llm_kit.emulator", "llm_kit.local"))
    ]
    return ["llm_kit", *names]


def test_every_llm_kit_exception_is_defined_in_llm_kit_errors() -> None:
    homeless = []
    for name in _llm_kit_modules():
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == name
                and name != "llm_kit.errors"
            ):
                homeless.append(f"{name}.{attr}")
    assert homeless == []


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("llm_kit", "BatchNotFinishedError"),
        ("llm_kit", "BatchSubmitError"),
        ("llm_kit", "OrphanBatchUnclearError"),
        ("llm_kit.batch", "BatchNotFinishedError"),
        ("llm_kit.batch", "BatchSubmitError"),
        ("llm_kit.batch.api", "BatchSubmitError"),
        ("llm_kit.batch.runner", "BatchNotFinishedError"),
    ],
)
def test_old_import_paths_of_the_exceptions_still_work(path: str, name: str) -> None:
    assert getattr(importlib.import_module(path), name) is getattr(llm_kit.errors, name)
