"""Prompts that only substitute names are checked and rendered without Jinja, to the very same
text and names."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from mmirage.config.templates import JINJA_GLOBALS, undeclared_names
from mmirage.config.templates import substitution as substitution_of
from mmirage.core.render.prompts import (
    compile_template,
    jinja_environment,
    render_prompt,
    render_template,
)
from mmirage.core.render.variables import RowError


class Shown:
    def __str__(self) -> str:
        return "shown"

    def __repr__(self) -> str:  # a test id that every pytest-xdist worker collects alike
        return "Shown()"


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


@pytest.mark.parametrize("text", SUBSTITUTIONS)
def test_substitution_reads_the_names_jinja_finds(text: str) -> None:
    from jinja2 import Environment, meta

    env = Environment()
    expected = meta.find_undeclared_variables(env.parse(text)) - set(env.globals)
    assert undeclared_names(text) == expected


def test_jinja_globals_are_jinjas() -> None:
    assert set(jinja_environment().globals) == JINJA_GLOBALS


def test_a_run_of_substitutions_does_not_import_jinja() -> None:
    probe = (
        "import sys\n"
        "from mmirage.config.templates import undeclared_names\n"
        "from mmirage.core.render.prompts import render_prompt\n"
        "from mmirage.core.render.renderer import OutputRenderer\n"
        "assert undeclared_names('Say {{ text }}') == {'text'}\n"
        "assert render_prompt('Say {{ text }}', {'text': 'hi'}) == 'Say hi'\n"
        "row = OutputRenderer({'a': '{{ answer }}'}).render({'answer': 3})\n"
        "print(row, 'jinja2' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "{'a': 3} False"


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
