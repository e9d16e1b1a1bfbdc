"""Prompt rendering: Jinja2 with undefined names as row errors, one compiled template per text.

An undefined name raises ``RowError`` (a typo must not send an empty prompt, and pay for it),
templates are compiled once, and an optional input's ``None`` renders as ``""`` rather than
``"None"``. As in plain ``jinja2.Template(prompt).render(**vars)``, which existing prompts were
written for, autoescape is off and one trailing newline of the template is dropped (Jinja's
default), so a YAML ``prompt: |`` block does not end the prompt with ``\\n``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import Environment, StrictUndefined, Template, TemplateError, TemplateSyntaxError

from mmirage.core.render.variables import RowError

# Errors a template can raise on one row's data (a filter on the wrong type, a bad index...).
RENDER_ERRORS: tuple[type[Exception], ...] = (
    TemplateError,
    TypeError,
    ValueError,
    LookupError,
    AttributeError,
    ArithmeticError,
)


_UNDEFINED_NAME = re.compile(r"^'([^']+)' is undefined$")


def _finalize(value: Any) -> Any:
    # Only optional inputs can be None: print nothing rather than the word "None".
    return "" if value is None else value


@lru_cache(maxsize=1)
def jinja_environment() -> Environment:
    """The one environment for prompts and the output schema (same rules in both)."""
    return Environment(
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=False,
        finalize=_finalize,
    )


@lru_cache(maxsize=4096)
def compile_template(text: str) -> Template:
    """Compiled once per distinct text; a syntax error is a config problem, not a row's."""
    try:
        return jinja_environment().from_string(text)
    except TemplateSyntaxError as exc:
        raise ValueError(
            f"template {text!r:.80} is not valid Jinja ({exc.message}, line {exc.lineno})"
        ) from None


def render_template(template: Template, variables: Mapping[str, Any], what: str) -> str:
    """Render one row; any data-dependent failure is a ``RowError`` naming ``what``.

    Same result as ``template.render(variables)`` at a third of the cost (measured: 19 → 7 µs
    a row): one flat context of globals + variables instead of Jinja's layered copy."""
    env = template.environment
    try:
        context = template.new_context({**env.globals, **variables}, shared=True)
        return env.concat(template.root_render_func(context))
    except RENDER_ERRORS as exc:
        raise _row_error(exc, variables, what) from None


def _row_error(exc: Exception, variables: Mapping[str, Any], what: str) -> RowError:
    message = getattr(exc, "message", None) or str(exc)
    undefined = _UNDEFINED_NAME.match(message)
    return RowError(
        f"{what} could not be rendered for this row ({message}); variables available: "
        f"{', '.join(variables) or 'none'}",
        variable=undefined.group(1) if undefined else None,
        path=what,
    )


@dataclass(frozen=True)
class Substitution:
    """A template that only substitutes names, ``a {{ x }} b {{ y }}``: rendered without Jinja,
    as Jinja renders it (``str(value)``, ``None`` as ``""``; line breaks as \\n and one trailing
    line break dropped, as Jinja's lexer does)."""

    literals: tuple[str, ...]  # one more than names: the text around them
    names: tuple[str, ...]

    def render(self, variables: Mapping[str, Any]) -> str:
        parts = [self.literals[0]]
        for name, literal in zip(self.names, self.literals[1:], strict=True):
            parts.append(str(_finalize(variables[name])))
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


def render_prompt(template_text: str, variables: Mapping[str, Any]) -> str:
    """The prompt text for one row."""
    simple = substitution(template_text)
    if simple is None or not all(name in variables for name in simple.names):
        return render_template(compile_template(template_text), variables, "prompt")
    try:
        return simple.render(variables)
    except RENDER_ERRORS as exc:  # a value whose str() fails
        raise _row_error(exc, variables, "prompt") from None
