"""Jinja templates are checked at load: syntax, and every name they use must exist.

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
    from jinja2 import Environment

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
    from jinja2 import TemplateSyntaxError, meta

    env = _environment()
    try:
        ast = env.parse(template)
    except TemplateSyntaxError as exc:
        reason = (exc.message or "syntax error").rstrip(".")
        raise TemplateProblem(
            f"is not a valid Jinja template ({reason}, line {exc.lineno})"
        ) from None
    return set(meta.find_undeclared_variables(ast)) - set(env.globals)


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
