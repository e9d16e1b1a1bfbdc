"""The output-schema renderer: a tree of Jinja strings + one row's variables → the saved row.

Rules (see reference §3.7 and §7.6):

* A string that is exactly ``{{ name }}`` or ``{{ name.field.sub }}`` (whitespace allowed) keeps
  the value's Python type: str, int, float, bool, None, list, dict (the object itself, not a copy),
  so a JSON output's number stays a number in the saved row.
* Any other string renders to ``str`` with the prompts' environment: an undefined name is a
  ``RowError`` (an empty string would hide the typo in every row).
* Dicts and lists recurse; other values (YAML numbers, booleans, null) are kept as written.
* A leaf whose template reads a ``batch_api`` output still pending (its value is the placeholder
  ``__BATCH_SUBMITTED__:<custom_id>``) is pending too: its value is that placeholder. Rendering is
  a pure function of the schema and the variables, so ``merge`` substitutes the real values
  (``fill_placeholders``) and renders again to get the same row as a live run.
* A failed row is rendered with ``unavailable`` naming the outputs it has no value for: a leaf
  that reads one of them is ``None``, every other leaf renders as in a good row, so a failed
  row keeps the fields that only use its inputs (``render_partial``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mmirage.config.templates import JINJA_GLOBALS, strings_in
from mmirage.core.render.prompts import compile_template, jinja_environment, render_template
from mmirage.core.render.variables import RowError
from mmirage.rundir import PLACEHOLDER_PREFIX

if TYPE_CHECKING:  # Jinja is imported when a leaf needs it (a bare reference does not)
    from jinja2 import Template

_BARE = re.compile(r"^\s*\{\{-?\s*([^\W\d]\w*(?:\.[^\W\d]\w*)*)\s*-?\}\}\s*$")
# Jinja literals look like names but are constants: they render as text.
_LITERALS = frozenset({"true", "false", "none", "True", "False", "None"})


def make_placeholder(custom_id: str) -> str:
    return f"{PLACEHOLDER_PREFIX}{custom_id}"


def is_placeholder(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(PLACEHOLDER_PREFIX)


def placeholder_id(value: Any) -> str | None:
    """The custom_id inside a placeholder, or ``None`` for any other value."""
    return value[len(PLACEHOLDER_PREFIX) :] if is_placeholder(value) else None


@dataclass(frozen=True)
class _Ref:
    """A bare ``{{ a.b.c }}``: looked up, not rendered, so the type survives."""

    path: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return (self.path[0],)


@dataclass(frozen=True)
class _Text:
    """Any other template: rendered to a string."""

    template: Template
    names: tuple[str, ...]  # variables it reads, in order of first appearance


_Leaf = _Ref | _Text


@lru_cache(maxsize=4096)
def compile_leaf(text: str) -> _Leaf:
    """One compiled form per distinct schema string."""
    path = _bare_path(text)
    if path is not None:
        return _Ref(path)
    return _Text(compile_template(text), _names_in(text))


def _bare_path(text: str) -> tuple[str, ...] | None:
    """The path a bare ``{{ a.b.c }}`` reads, else ``None`` (no Jinja needed to tell)."""
    bare = _BARE.match(text)
    if bare:
        path = tuple(bare.group(1).split("."))
        if path[0] not in _LITERALS and path[0] not in JINJA_GLOBALS:
            return path
    return None


def bare_name(tree: Any) -> str | None:
    """The variable a schema value that is exactly ``{{ name }}`` renders to, kept as it is
    (``render_value`` gives that variable's value, or its placeholder while pending); else
    ``None``."""
    path = _bare_path(tree) if isinstance(tree, str) else None
    return path[0] if path is not None and len(path) == 1 else None


def _names_in(text: str) -> tuple[str, ...]:
    from jinja2 import meta, nodes

    env = jinja_environment()
    ast = env.parse(text)
    # meta gives the right set (no loop or {% set %} names) but unordered: order by the AST.
    free = meta.find_undeclared_variables(ast) - set(env.globals)
    return tuple(dict.fromkeys(n.name for n in ast.find_all(nodes.Name) if n.name in free))


def schema_variables(schema: Any) -> list[str]:
    """Variables a schema reads, in order of first appearance (what merge must keep/substitute)."""
    found: dict[str, None] = {}
    for _, text in strings_in(schema):
        found.update(dict.fromkeys(compile_leaf(text).names))
    return list(found)


def fill_placeholders(variables: Mapping[str, Any], results: Mapping[str, Any]) -> dict[str, Any]:
    """``variables`` with each placeholder replaced by ``results[custom_id]`` when present."""
    filled = dict(variables)
    for name, value in variables.items():
        custom_id = placeholder_id(value)
        if custom_id is not None and custom_id in results:
            filled[name] = results[custom_id]
    return filled


def find_placeholders(tree: Any) -> list[str]:
    """Every placeholder left in a rendered row (empty when the row is complete)."""
    if is_placeholder(tree):
        return [tree]
    if isinstance(tree, Mapping):
        tree = tree.values()
    elif not isinstance(tree, list | tuple):
        return []
    return [p for item in tree for p in find_placeholders(item)]


class OutputRenderer:
    """Compiled once per pipeline (syntax errors surface here), then ``render`` per row."""

    def __init__(self, output_schema: Mapping[str, Any], *, remove_columns: bool = False) -> None:
        if not isinstance(output_schema, Mapping):
            raise ValueError(
                f"output_schema must be a mapping of column name to template, got "
                f"{type(output_schema).__name__}"
            )
        self.schema = output_schema
        self.remove_columns = remove_columns
        self._tree = {str(k): _compile(v) for k, v in output_schema.items()}
        self.variables: list[str] = schema_variables(output_schema)
        # Per column: the variable a bare ``{{ name }}`` reads (its value is the column's, a
        # pending placeholder included), else None (rendered as a tree).
        self._plan = [
            (key, node.path[0] if isinstance(node, _Ref) and len(node.path) == 1 else None, node)
            for key, node in self._tree.items()
        ]
        # When every column is a bare ``{{ name }}``: (column, variable) pairs, copied as they are.
        self._copies: list[tuple[str, str]] = [(k, n) for k, n, _ in self._plan if n is not None]
        if len(self._copies) < len(self._plan):
            self._copies = []

    def render(
        self, variables: Mapping[str, Any], row: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """The output row: schema keys over the source columns (unless ``remove_columns``)."""
        (out,), errors = self.render_each((variables,), ({} if row is None else row,))
        if errors:
            raise errors[0]
        assert out is not None
        return out

    def render_each(
        self, variables: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
    ) -> tuple[list[dict[str, Any] | None], dict[int, RowError]]:
        """``render`` for many rows in one call (rows are many: one call per group, not per
        row). A row that cannot render is ``None`` in the list, its error under its index in
        the dict."""
        plan, keep_row = self._plan, not self.remove_columns
        out: list[dict[str, Any] | None] = []
        errors: dict[int, RowError] = {}
        if self._copies:
            try:
                return self._copied(variables, rows), errors
            except KeyError:  # a row lacks a variable: row by row, which says so
                pass
        for index, (values, row) in enumerate(zip(variables, rows, strict=True)):
            rendered: dict[str, Any] = dict(row) if keep_row else {}
            try:
                for key, name, node in plan:
                    if name is not None and name in values:
                        rendered[key] = values[name]
                    else:
                        rendered[key] = _render(node, values, f"output_schema.{key}")
            except RowError as exc:
                errors[index] = exc
                out.append(None)
            else:
                out.append(rendered)
        return out, errors

    def _copied(
        self, variables: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any] | None]:
        """``render_each`` when every column is a bare ``{{ name }}`` (the fewest steps a
        row); a KeyError when some row lacks one of them."""
        copies, keep_row = self._copies, not self.remove_columns
        out: list[dict[str, Any] | None] = []
        for values, row in zip(variables, rows, strict=True):
            copied = dict(row) if keep_row else {}
            for key, name in copies:
                copied[key] = values[name]
            out.append(copied)
        return out

    def render_partial(
        self,
        variables: Mapping[str, Any],
        row: Mapping[str, Any] | None,
        unavailable: Collection[str],
    ) -> tuple[dict[str, Any], str | None]:
        """A failed row: every leaf that reads an ``unavailable`` name, or that cannot be
        rendered, is ``None``; the rest renders as ``render`` would. Also returns the first
        leaf's rendering error (for ``__schema__``), or ``None``."""
        out: dict[str, Any] = {} if self.remove_columns or row is None else dict(row)
        errors: list[str] = []
        for key, node in self._tree.items():
            out[key] = _render_partial(
                node, variables, f"output_schema.{key}", frozenset(unavailable), errors
            )
        return out, (errors[0] if errors else None)


def render_row(
    output_schema: Mapping[str, Any],
    variables: Mapping[str, Any],
    row: Mapping[str, Any] | None = None,
    *,
    remove_columns: bool = False,
) -> dict[str, Any]:
    """One-shot ``OutputRenderer(...).render(...)`` (templates are still compiled once)."""
    return OutputRenderer(output_schema, remove_columns=remove_columns).render(variables, row)


def render_value(tree: Any, variables: Mapping[str, Any], where: str = "output_schema") -> Any:
    """Render any schema subtree (a string, dict, list or constant)."""
    return _render(_compile(tree), variables, where)


def render_failed_columns(
    schema: Mapping[str, Any],
    row: dict[str, Any],
    variables: Mapping[str, Any],
    unavailable: Collection[str],
) -> str | None:
    """Merge's half of ``render_partial``: render again, in place, the columns of ``row``
    that still hold a placeholder, ``None`` where they read an ``unavailable`` output. Returns
    the first rendering error, or ``None``."""
    errors: list[str] = []
    missing = frozenset(unavailable)
    for key, tree in schema.items():
        if find_placeholders(row.get(key)):
            where = f"output_schema.{key}"
            row[key] = _render_partial(_compile(tree), variables, where, missing, errors)
    return errors[0] if errors else None


def _compile(tree: Any) -> Any:
    if isinstance(tree, str):
        return compile_leaf(tree)
    if isinstance(tree, Mapping):
        return {str(k): _compile(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [_compile(v) for v in tree]
    return tree


def _render(node: Any, variables: Mapping[str, Any], where: str) -> Any:
    if isinstance(node, _Ref | _Text):
        pending = _pending(node.names, variables)
        if pending is not None:
            return pending
        if isinstance(node, _Ref):
            return _lookup(node.path, variables, where)
        return render_template(node.template, variables, where)
    if isinstance(node, dict):
        return {k: _render(v, variables, f"{where}.{k}") for k, v in node.items()}
    if isinstance(node, list):
        return [_render(v, variables, f"{where}[{i}]") for i, v in enumerate(node)]
    return node


def _render_partial(
    node: Any,
    variables: Mapping[str, Any],
    where: str,
    unavailable: frozenset[str],
    errors: list[str],
) -> Any:
    if isinstance(node, dict):
        return {
            k: _render_partial(v, variables, f"{where}.{k}", unavailable, errors)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [
            _render_partial(v, variables, f"{where}[{i}]", unavailable, errors)
            for i, v in enumerate(node)
        ]
    if isinstance(node, _Ref | _Text) and not unavailable.isdisjoint(node.names):
        return None
    try:
        return _render(node, variables, where)
    except RowError as exc:
        errors.append(str(exc))
        return None


def _pending(names: Iterable[str], variables: Mapping[str, Any]) -> str | None:
    for name in names:
        value = variables.get(name)
        if is_placeholder(value):
            return str(value)
    return None


def _lookup(path: tuple[str, ...], variables: Mapping[str, Any], where: str) -> Any:
    root = path[0]
    if root not in variables:
        raise RowError(
            f"{where} uses '{root}', which is not a variable of this row; variables available: "
            f"{', '.join(variables) or 'none'}",
            variable=root,
            path=where,
        )
    value = variables[root]
    if len(path) == 1:
        return value
    from jinja2 import Undefined

    env = jinja_environment()
    for depth, part in enumerate(path[1:], start=2):
        # Data first: a JSON field named "items" wins over dict.items.
        if isinstance(value, Mapping) and part in value:
            value = value[part]
            continue
        value = env.getattr(value, part)
        if isinstance(value, Undefined):
            raise RowError(
                f"{where}: '{'.'.join(path[: depth - 1])}' has no field '{part}' in this row",
                variable=root,
                path=where,
            )
    return value
