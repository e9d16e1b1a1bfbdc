"""Jinja templates are checked at load: syntax, and every name they use must exist."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mmirage.errors import MmirageError

if TYPE_CHECKING:
    from jinja2 import Environment


@lru_cache(maxsize=1)
def _environment() -> Environment:
    from jinja2 import Environment

    return Environment()


class TemplateProblem(MmirageError, ValueError):
    pass


def undeclared_names(template: str) -> set[str]:
    """Names a template reads from its context; raises ``TemplateProblem`` on bad syntax."""
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
