"""Field descriptions read from the source: the attribute docstrings of config classes.

A field is described by a string literal on the line(s) directly below it::

    max_retries: NonNegativeInt = 3
    \"\"\"How many times ``--retry`` re-runs a failed shard.\"\"\"

The reference pages of the docs and ``tests/test_descriptions.py`` read them from here.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from functools import cache
from typing import Any


def field_descriptions(cls: type) -> dict[str, str]:
    """Each documented attribute of ``cls`` and its bases, with its description.

    Args:
        cls: any class whose source can be read (a dataclass, a pydantic model ...).

    Returns:
        ``{attribute name: description}``, the description cleaned like a docstring
        (``inspect.cleandoc``). A subclass's description wins over its base's; a field
        a subclass redeclares without one keeps its base's.
    """
    descriptions: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object:
            descriptions.update(_own_descriptions(klass))
    return descriptions


@cache
def _own_descriptions(klass: type) -> dict[str, str]:
    try:
        source = inspect.getsource(klass)
    except (OSError, TypeError):  # built in, or defined where no source is kept (a REPL)
        return {}
    node = ast.parse(textwrap.dedent(source)).body[0]
    if not isinstance(node, ast.ClassDef):
        return {}
    found: dict[str, str] = {}
    for statement, following in zip(node.body, node.body[1:], strict=False):
        name = _assigned_name(statement)
        text = _string_literal(following)
        if name is not None and text is not None:
            found[name] = inspect.cleandoc(text)
    return found


def _assigned_name(statement: ast.stmt) -> str | None:
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        return statement.target.id
    if (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
    ):
        return statement.targets[0].id
    return None


def _string_literal(statement: ast.stmt) -> str | None:
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        value = statement.value.value
        return value if isinstance(value, str) else None
    return None


def yaml_fields(cls: type) -> list[dataclasses.Field[Any]]:
    """The dataclass fields of ``cls`` that are YAML keys (``metadata={"internal": True}``
    and ``init=False`` fields are not)."""
    return [f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal", False)]


def reachable_dataclasses(*roots: type) -> list[type]:
    """Every dataclass that the YAML can reach from ``roots``, following field types through
    unions, ``list``/``dict`` and ``Annotated``; roots first, then in discovery order."""
    seen: list[type] = []
    pending = list(roots)
    while pending:
        cls = pending.pop(0)
        if cls in seen:
            continue
        seen.append(cls)
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in yaml_fields(cls):
            pending.extend(_dataclasses_in(hints.get(f.name, f.type)))
    return seen


def _dataclasses_in(hint: Any) -> list[type]:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return []
    args = typing.get_args(hint)
    if origin is typing.Annotated:
        args = args[:1]
    elif origin is None:
        return []
    return [found for arg in args for found in _dataclasses_in(arg)]


__all__ = ["field_descriptions", "reachable_dataclasses", "yaml_fields"]
