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
        message = getattr(exc, "message", None) or str(exc)
        undefined = _UNDEFINED_NAME.match(message)
        raise RowError(
            f"{what} could not be rendered for this row ({message}); variables available: "
            f"{', '.join(variables) or 'none'}",
            variable=undefined.group(1) if undefined else None,
            path=what,
        ) from None


def render_prompt(template_text: str, variables: Mapping[str, Any]) -> str:
    """The prompt text for one row."""
    return render_template(compile_template(template_text), variables, "prompt")
