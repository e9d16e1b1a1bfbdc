"""llm_kit's layout promises (issue 9): every exception in one module (the old import paths
kept), no folder that imports one importing it back, no module over 400 lines."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import llm_kit
import llm_kit.errors
from llm_kit import providers


def _llm_kit_modules() -> list[str]:
    names = [
        info.name
        for info in pkgutil.walk_packages(llm_kit.__path__, "llm_kit.")
        # The emulator is a test server with its own errors; the local engine needs llama_cpp.
        if not info.name.startswith(("provider_emulator", "llm_kit.local"))
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


SRC = Path(llm_kit.__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    """Modules imported anywhere in ``path``, function-level ones included, those under
    ``if TYPE_CHECKING:`` aside."""
    found: set[str] = set()

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if ast.unparse(node.test).endswith("TYPE_CHECKING"):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            assert node.level == 0, f"{path}: relative import"
            module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)

    Visitor().visit(ast.parse(path.read_text()))
    return found


def _module(path: Path) -> str:
    parts = ["llm_kit", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _folder(module: str) -> str:
    # Each package is a folder; a top-level module of a package belongs to it. The emulator's
    # provider folders count on their own.
    parts = module.split(".")
    depth = 3 if parts[:2] == ["llm_kit", "emulator"] else 2
    return ".".join(parts[:depth])


def test_no_llm_kit_folder_imports_one_that_imports_it_back() -> None:
    files = {_module(p): p for p in SRC.rglob("*.py")}
    edges: set[tuple[str, str]] = set()
    for name, path in files.items():
        for target in _imports(path):
            parts = target.split(".")
            while parts and ".".join(parts) not in files:
                parts.pop()
            here, there = _folder(name), _folder(".".join(parts))
            if parts and here != there and not there.startswith(here + "."):
                edges.add((here, there))
    assert sorted((a, b) for a, b in edges if (b, a) in edges and a < b) == []
    assert not [(a, b) for a, b in edges if b.startswith("mmirage")]


def test_no_llm_kit_module_is_over_400_lines() -> None:
    long = {
        _module(p): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}


def test_the_former_provider_tables_are_read_from_the_registry() -> None:
    from llm_kit.batch import api
    from llm_kit.providers import provider_spec

    assert providers.MESSAGE_FORMATS == ("openai", "anthropic", "gemini", "local")
    assert providers.CODECS["gemini"] is provider_spec("gemini").codec
    assert api.BATCH_BACKENDS["anthropic"] is provider_spec("anthropic").batch_backend
    assert "local" not in api.BATCH_BACKENDS
