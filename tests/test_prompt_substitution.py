"""Prompts that only substitute names are rendered without Jinja, to the very same text."""

from __future__ import annotations

from typing import Any

import pytest

from mmirage.core.render.prompts import compile_template, render_prompt, render_template
from mmirage.core.render.prompts import substitution as substitution_of
from mmirage.core.render.variables import RowError


class Shown:
    def __str__(self) -> str:
        return "shown"


class Unprintable:
    def __str__(self) -> str:
        raise ValueError("no text for this value")


SUBSTITUTIONS = [
    "{{ text }}",
    "{{text}}",
    "Summarise: {{ text }}",
    "{{ a }}{{ b }}",
    "{{\n  a\n}} and {{ b }}\n",
    "line one\r\nline two {{ a }}\rthree\n\n",
    "{{ a }}\r\n",
    "no variables at all",
    "",
    "\n",
    "a } b { c",
    "{{ range }}",  # a Jinja global, but the row's variable wins
]
VALUES: list[Any] = ["é ✓", "", 3, 2.5, None, True, {"k": [1, "v"]}, [None], Shown()]


@pytest.mark.parametrize("text", SUBSTITUTIONS)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_substitution_renders_what_jinja_renders(text: str, value: Any) -> None:
    simple = substitution_of(text)
    assert simple is not None
    variables = {"text": value, "a": value, "b": "B", "range": value}
    expected = render_template(compile_template(text), variables, "prompt")
    assert simple.render(variables) == expected
    assert render_prompt(text, variables) == expected


@pytest.mark.parametrize(
    "text",
    [
        "{{ a.b }}",
        "{{ a | upper }}",
        "{{- a }}",
        "{{ a -}}",
        "{% if a %}x{% endif %}",
        "{# note #}{{ a }}",
        "{{ true }}",
        "{{ none }}",
        "{{ self }}",
        "{{ 'a' }}",
        "{{ a + b }}",
        "{{ é }}",
        "{{ a }} }}",
    ],
)
def test_other_templates_are_left_to_jinja(text: str) -> None:
    assert substitution_of(text) is None


def test_an_undefined_name_is_still_a_row_error() -> None:
    with pytest.raises(RowError, match="'missing' is undefined"):
        render_prompt("{{ missing }}", {"a": 1})


def test_a_value_without_text_is_a_row_error() -> None:
    with pytest.raises(RowError, match="no text for this value"):
        render_prompt("{{ a }}", {"a": Unprintable()})
