"""Prompt rendering: Jinja2 with undefined names as row errors, one compiled template per text.

An undefined name raises ``RowError`` (a typo must not send an empty prompt, and pay for it),
templates are compiled once, and an optional input's ``None`` renders as ``""`` rather than
``"None"``. As in plain ``jinja2.Template(prompt).render(**vars)``, which existing prompts were
written for, autoescape is off and one trailing newline of the template is dropped (Jinja's
default), so a YAML ``prompt: |`` block does not end the prompt with ``\\n``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mmirage.config.templates import substitution
from mmirage.core.render.variables import RowError

if TYPE_CHECKING:  # Jinja is imported when a template needs it (a substitution does not)
    from jinja2 import Environment, Template

# Errors a template can raise on one row's data (a filter on the wrong type, a bad index...).
_DATA_ERRORS: tuple[type[Exception], ...] = (
    TypeError,
    ValueError,
    LookupError,
    AttributeError,
    ArithmeticError,
)


@lru_cache(maxsize=1)
def render_errors() -> tuple[type[Exception], ...]:
    """What rendering a row can raise: Jinja's own errors and the data's."""
    from jinja2 import TemplateError

    return (TemplateError, *_DATA_ERRORS)


_UNDEFINED_NAME = re.compile(r"^'([^']+)' is undefined$")


def _finalize(value: Any) -> Any:
    # Only optional inputs can be None: print nothing rather than the word "None".
    return "" if value is None else value


@lru_cache(maxsize=1)
def jinja_environment() -> Environment:
    """The one environment for prompts and the output schema (same rules in both)."""
    from jinja2 import Environment, StrictUndefined

    return Environment(
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=False,
        finalize=_finalize,
    )


@lru_cache(maxsize=4096)
def compile_template(text: str) -> Template:
    """Compiled once per distinct text; a syntax error is a config problem, not a row's."""
    from jinja2 import TemplateSyntaxError

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
    except render_errors() as exc:
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


@lru_cache(maxsize=1024)
def prompt_renderer(template_text: str) -> Callable[[Mapping[str, Any]], str]:
    """``render_prompt`` for one template, compiled once: a row pays for the rendering only."""
    simple = substitution(template_text)
    if simple is None:
        template = compile_template(template_text)
        return lambda variables: render_template(template, variables, "prompt")
    lone = simple.names[0] if simple.literals == ("", "") else None

    def render(variables: Mapping[str, Any]) -> str:
        try:
            if lone is not None:  # "{{ text }}", the common prompt
                value = variables[lone]
                return value if type(value) is str else "" if value is None else str(value)
            return simple.render(variables)
        except KeyError:  # Jinja's own message names the missing variable
            return render_template(compile_template(template_text), variables, "prompt")
        except render_errors() as exc:  # a value whose str() fails
            raise _row_error(exc, variables, "prompt") from None

    return render


def render_prompt(template_text: str, variables: Mapping[str, Any]) -> str:
    """The prompt text for one row."""
    return prompt_renderer(template_text)(variables)
