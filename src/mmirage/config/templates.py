"""Jinja templates are checked at load: syntax, every name they use must exist, and the field
paths they read (``{{ label.sentiment }}``) are found for checking against declared JSON fields.

A template that only substitutes names (``Summarise: {{ text }}``, the common prompt) is a
``Substitution``: checked, and rendered, without importing Jinja (~35 ms of every start-up).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mmirage.errors import MmirageError

if TYPE_CHECKING:
    from jinja2 import Environment, nodes

# The names of jinja2.defaults.DEFAULT_NAMESPACE: Jinja's globals, not a row's variables.
JINJA_GLOBALS = frozenset({"range", "dict", "lipsum", "cycler", "joiner", "namespace"})


@lru_cache(maxsize=1)
def _environment() -> Environment:
    from jinja2 import Environment

    return Environment()


class TemplateProblem(MmirageError, ValueError):
    pass


def undeclared_names(template: str) -> set[str]:
    """Names a template reads from its context; raises ``TemplateProblem`` on bad syntax."""
    simple = substitution(template)
    if simple is not None:
        return set(simple.names) - JINJA_GLOBALS
    from jinja2 import meta

    return set(meta.find_undeclared_variables(_parse(template))) - set(_environment().globals)


def _parse(template: str) -> nodes.Template:
    # Not cached: meta.find_undeclared_variables folds constants in the tree it is given.
    from jinja2 import TemplateSyntaxError

    try:
        return _environment().parse(template)
    except TemplateSyntaxError as exc:
        reason = (exc.message or "syntax error").rstrip(".")
        raise TemplateProblem(
            f"is not a valid Jinja template ({reason}, line {exc.lineno})"
        ) from None


# One step of a field path: a key (``.x``, ``["x"]``), a list index (``[0]``), or ``None``: a
# subscript known only per row (``[i]``, ``[n - 1]``).
Step = str | int | None
FieldPath = tuple[str, tuple[Step, ...]]  # the variable, then the steps read into it
# A chain under these may be missing on purpose (``x.y | default("")``, ``x.y is defined``).
_MAY_BE_MISSING = frozenset({"default", "d", "defined", "undefined"})


def field_paths(template: str) -> list[FieldPath]:
    """The field paths a template reads from its context's variables: ``{{ a.b[0].c }}`` gives
    ``("a", ("b", 0, "c"))``. Left out, so a check never blames what may be right: a name the
    template assigns itself (``{% for %}``, ``{% set %}``, macro arguments), a chain under a slice
    (cut there), and any path at or below one guarded by ``default`` or ``is defined``."""
    if substitution(template) is not None:
        return []  # names only, no fields
    from jinja2 import nodes

    ast = _parse(template)
    assigned = {n.name for n in ast.find_all(nodes.Name) if n.ctx != "load"}
    found: list[FieldPath] = []
    guarded: list[FieldPath] = []
    _collect(ast, found, guarded, guarding=False)
    return [
        path
        for path in dict.fromkeys(found)
        if path[0] not in assigned
        and not any(g[0] == path[0] and path[1][: len(g[1])] == g[1] for g in guarded)
    ]


def _collect(
    node: nodes.Node, found: list[FieldPath], guarded: list[FieldPath], *, guarding: bool
) -> None:
    from jinja2 import nodes

    if isinstance(node, nodes.Getattr | nodes.Getitem):
        root, steps, inner = _chain(node)
        if isinstance(root, nodes.Name) and root.ctx == "load":
            (guarded if guarding else found).append((root.name, steps))
        else:
            inner.append(root)
        for child in inner:  # subscripts and a computed root hold chains of their own
            _collect(child, found, guarded, guarding=False)
        return
    protected: nodes.Node | None = None  # the value a default/defined may find missing
    if isinstance(node, nodes.Filter | nodes.Test) and node.name in _MAY_BE_MISSING:
        protected = node.node
    for child in node.iter_child_nodes():
        inside = child is protected or (guarding and protected is None)
        _collect(child, found, guarded, guarding=inside)


def _chain(node: nodes.Expr) -> tuple[nodes.Expr, tuple[Step, ...], list[nodes.Node]]:
    """``a.b[0]`` → (``a``, ("b", 0), expressions inside its subscripts)."""
    from jinja2 import nodes

    outer_first: list[Step] = []
    inner: list[nodes.Node] = []
    while isinstance(node, nodes.Getattr | nodes.Getitem):
        if isinstance(node, nodes.Getattr):
            outer_first.append(node.attr)
        elif isinstance(node.arg, nodes.Slice):
            outer_first.clear()  # a slice of a list is a list, not an item: stop before it
            inner.append(node.arg)
        elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str | int):
            value = node.arg.value
            outer_first.append(None if isinstance(value, bool) else value)
        elif (index := _negative_index(node.arg)) is not None:
            outer_first.append(index)
        else:
            outer_first.append(None)
            inner.append(node.arg)
        node = node.node
    return node, tuple(reversed(outer_first)), inner


def _negative_index(arg: nodes.Expr) -> int | None:
    """``-1`` in ``[-1]`` (Jinja parses it as the negation of 1)."""
    from jinja2 import nodes

    if isinstance(arg, nodes.Neg) and isinstance(arg.node, nodes.Const):
        value = arg.node.value
        return -value if type(value) is int else None
    return None


@dataclass(frozen=True)
class Substitution:
    """A template that only substitutes names, ``a {{ x }} b {{ y }}``: rendered as the prompts'
    Jinja environment renders it (``str(value)``, ``None`` as ``""``; line breaks as \\n and one
    trailing line break dropped, as Jinja's lexer does)."""

    literals: tuple[str, ...]  # one more than names: the text around them
    names: tuple[str, ...]

    def render(self, variables: Mapping[str, Any]) -> str:
        parts = [self.literals[0]]
        for name, literal in zip(self.names, self.literals[1:], strict=True):
            value = variables[name]
            parts.append("" if value is None else str(value))
            parts.append(literal)
        return "".join(parts)


_SUBSTITUTED = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_JINJA_MARKS = ("{{", "{%", "{#", "}}", "%}", "#}")
_NEWLINE = re.compile(r"\r\n|\r|\n")  # jinja2.lexer's newline_re
# Names Jinja does not read as a variable: constants, operators, the template itself.
_NOT_VARIABLES = frozenset(
    {"true", "false", "none", "True", "False", "None", "and", "or", "not", "in", "is", "if"}
    | {"else", "self", "loop", "super", "caller", "varargs", "kwargs"}
)


@lru_cache(maxsize=4096)
def substitution(text: str) -> Substitution | None:
    """``text`` as a ``Substitution`` when it is one; else ``None`` (Jinja renders it)."""
    lines = _NEWLINE.split(text)
    if lines[-1] == "":  # keep_trailing_newline=False
        del lines[-1]
    pieces = _SUBSTITUTED.split("\n".join(lines))
    literals, names = tuple(pieces[0::2]), tuple(pieces[1::2])
    if any(mark in literal for literal in literals for mark in _JINJA_MARKS):
        return None
    if not _NOT_VARIABLES.isdisjoint(names):
        return None
    return Substitution(literals, names)


def strings_in(
    tree: Any, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every string value of an output_schema tree, with its path (keys are column names, not
    templates)."""
    if isinstance(tree, str):
        yield path, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from strings_in(value, (*path, str(key)))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from strings_in(value, (*path, index))
