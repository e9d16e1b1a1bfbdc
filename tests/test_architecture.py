"""The house rules, checked on the source tree: no import circle between modules or between
folders (function-level and ``if TYPE_CHECKING:`` imports count), llm_kit never imports mmirage
nor the provider emulator (``if TYPE_CHECKING:`` imports aside), and no module over 400 lines."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imported(path: Path, name: str, *, annotations: bool) -> set[str]:
    """What the module imports anywhere, function-level imports included; those under
    ``if TYPE_CHECKING:`` only when ``annotations``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]

    class Visitor(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            if not annotations and (
                getattr(test, "id", None) == "TYPE_CHECKING"
                or getattr(test, "attr", None) == "TYPE_CHECKING"
            ):
                for child in node.orelse:
                    self.visit(child)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)

    Visitor().visit(tree)
    return found


def _graph(*, annotations: bool = False) -> dict[str, set[str]]:
    """Module → the modules it imports; ``annotations`` counts ``if TYPE_CHECKING:`` imports."""
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in _imported(path, name, annotations=annotations):
            parts = target.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            resolved = ".".join(parts)
            # A package importing its own submodules (re-exports) is not a circle.
            if parts and resolved != name and not resolved.startswith(name + "."):
                graph[name].add(resolved)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def _folder(module: str) -> str:
    parts = module.split(".")
    if parts[:2] == ["mmirage", "core"] and len(parts) > 2:
        return ".".join(parts[:3])
    if parts[0] == "provider_emulator":  # one server, one folder (as inside llm_kit before)
        return parts[0]
    return ".".join(parts[:2])


def test_no_import_circle_between_modules() -> None:
    # An import needed only for an annotation still ties the two modules together: each can
    # only be understood, checked and moved with the other.
    assert _cycles(_graph(annotations=True)) == []


def test_no_import_circle_between_folders() -> None:
    # Annotation-only imports count here too: ``llm_kit.errors`` naming ``BatchJob`` under
    # ``if TYPE_CHECKING:`` once made every llm_kit folder one circle (errors → batch → errors).
    folders: dict[str, set[str]] = defaultdict(set)
    for source, targets in _graph(annotations=True).items():
        for target in targets:
            if _folder(source) != _folder(target):
                folders[_folder(source)].add(_folder(target))
    assert _cycles(folders) == []


def test_annotation_only_imports_are_counted_when_asked(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "if TYPE_CHECKING:\n"
        "    from pkg.a import A\n"
        "if typing.TYPE_CHECKING:\n"
        "    import pkg.b\n"
        "else:\n"
        "    import pkg.c\n"
        "def f() -> None:\n"
        "    from pkg import d\n",
        encoding="utf-8",
    )
    plain = _imported(module, "pkg.m", annotations=False)
    every = _imported(module, "pkg.m", annotations=True)
    assert {"pkg.c", "pkg.d"} <= plain
    assert not {"pkg.a", "pkg.b"} & plain
    assert {"pkg.a", "pkg.b", "pkg.c", "pkg.d"} <= every


def test_llm_kit_never_imports_mmirage() -> None:
    offenders = [
        source
        for source, targets in _graph().items()
        if source.startswith("llm_kit") and any(t.startswith("mmirage") for t in targets)
    ]
    assert offenders == []


def test_llm_kit_never_imports_the_emulator_which_shares_only_wire_types_with_it() -> None:
    graph = _graph()
    into_emulator = [
        source
        for source, targets in graph.items()
        if source.startswith("llm_kit") and any(t.startswith("provider_emulator") for t in targets)
    ]
    assert into_emulator == []
    shared = {
        target
        for source, targets in graph.items()
        if source.startswith("provider_emulator")
        for target in targets
        if not target.startswith("provider_emulator")
    }
    assert not any(t.startswith("mmirage") for t in shared)
    assert {t for t in shared if t.startswith("llm_kit")} <= {"llm_kit.errors", "llm_kit.loops"}


def test_no_module_over_400_lines() -> None:
    long = {
        str(path.relative_to(SRC)): n
        for path in SRC.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert long == {}
