"""Field paths read into a JSON output with declared fields are checked at load: a typo such as
``{{ label.sentimnt }}`` is a configuration error (exit 2) before any row is paid for, and what
load time cannot judge (filters, indexes, methods, plain outputs) is never refused."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmirage.config import ConfigError, load_mmirage_config_dict
from mmirage.config.templates import field_paths

PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
QUOTE = (
    "<file>: <field>: reads <path>, but output '<name>' declares no field '<field>' "
    "(did you mean '<suggestion>'?)."
)
LABEL: dict[str, Any] = {
    "name": "label",
    "type": "llm",
    "output_type": "JSON",
    "prompt": "Classify: {{ text }}",
    "output_schema": {
        "sentiment": {"type": "str", "enum": ["positive", "negative"]},
        "tags": "list[str]",
        "summary": {"type": "object", "properties": {"headline": "str", "words": "int"}},
        "aspects": {
            "type": "list",
            "items": {"type": "object", "properties": {"name": "str", "positive": "bool"}},
        },
    },
}


def config(schema: dict[str, Any], *later: dict[str, Any]) -> dict[str, Any]:
    """A config whose JSON output ``label`` declares nested fields, a plain output ``answer``
    and a custom output ``extra``, then ``later`` outputs and the given ``output_schema``."""
    return {
        "processors": [
            {"type": "llm", "model": "m", "base_url": "http://127.0.0.1:9/v1"},
            {"type": "custom", "script_path": "script.py", "function_name": "f"},
        ],
        "loading_params": {
            "state_dir": "state",
            "datasets": [{"path": "d.jsonl", "type": "JSONL", "output_dir": "out"}],
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [
                copy.deepcopy(LABEL),
                {"name": "answer", "type": "llm", "prompt": "Answer: {{ text }}"},
                {"name": "extra", "type": "custom"},
                *later,
            ],
            "output_schema": schema,
        },
    }


def load(data: dict[str, Any]) -> Any:
    return load_mmirage_config_dict(data, source="paths.yaml", env={})


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load(data)
    return str(info.value)


@pytest.mark.parametrize("command", ["check", "run"])
def test_a_typo_exits_2_with_one_sentence_before_any_row(command: str, tmp_path: Path) -> None:
    data = config({"sentiment": "{{ label.sentimnt }}"})
    data["processors"] = data["processors"][:1]
    data["processing_params"]["outputs"] = [copy.deepcopy(LABEL)]
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (tmp_path / "d.jsonl").write_text('{"text": "great"}\n')
    env = {**os.environ, "OPENAI_API_KEY": "sk-test", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "mmirage", command, "pipeline.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: pipeline.yaml: processing_params.output_schema.sentiment: reads label.sentimnt, "
        "but output 'label' declares no field 'sentimnt' (did you mean 'sentiment'?)."
    ]
    assert not (tmp_path / "out").exists()  # refused before a row was read, let alone sent
    # The troubleshooting page quotes this sentence, each <placeholder> standing for any text.
    pattern = ".+?".join(re.escape(piece) for piece in re.split(r"<[A-Za-z_ ]+>", QUOTE))
    assert QUOTE in PAGE.read_text(encoding="utf-8")
    assert re.fullmatch(pattern, lines[0].removeprefix("error: "))


@pytest.mark.parametrize(
    ("template", "read", "field", "hint"),
    [
        (
            "{{ label.summary.headlin }}",
            "label.summary.headlin",
            "summary.headlin",
            "summary.headline",
        ),
        ("{{ label.aspects[0].nme }}", "label.aspects[0].nme", "aspects[].nme", "aspects[].name"),
        (
            "{{ label.aspects[-1].nme }}",
            "label.aspects[-1].nme",
            "aspects[].nme",
            "aspects[].name",
        ),
        ("{{ label['summary']['wrds'] }}", "label.summary.wrds", "summary.wrds", "summary.words"),
        ("{{ label.sentimnt | upper }}", "label.sentimnt", "sentimnt", "sentiment"),
        ("{% if label.tag %}x{% endif %}", "label.tag", "tag", "tags"),
    ],
)
def test_a_wrong_nested_path_names_the_field_and_the_nearest_one(
    template: str, read: str, field: str, hint: str
) -> None:
    message = error_of(config({"out": {"deep": [template]}}))
    assert message.startswith("paths.yaml: processing_params.output_schema.out.deep[0]: ")
    assert f"reads {read}, but output 'label' declares no field '{field}'" in message
    assert f"(did you mean '{hint}'?)" in message


def test_without_a_near_name_the_declared_fields_are_listed() -> None:
    message = error_of(config({"x": "{{ label.summary.zzzz }}"}))
    assert message.endswith("declares no field 'summary.zzzz'; declared there: headline, words.")


def test_a_list_of_names_declares_fields_too() -> None:
    data = config({"q": "{{ label.questoin }}"})
    data["processing_params"]["outputs"][0]["output_schema"] = ["question", "answer"]
    assert "(did you mean 'question'?)" in error_of(data)


@pytest.mark.parametrize(
    "template",
    [
        "{{ label }}",
        "{{ label.sentiment }}",
        "{{ label.summary.headline }}",
        "{{ label.summary }}",
        "{{ label.aspects[0].name }}",
        "{{ label.aspects.0.positive }}",
        "{{ label['summary']['words'] }}",
        # filters, indexing, methods and loops: nothing to refuse
        "{{ label.tags[0] }}",
        "{{ label.tags[-1] | upper }}",
        "{{ label.sentiment | upper }}",
        "{{ label.tags | join(', ') }}",
        "{{ label.tags[1:] | join(', ') }}",
        "{{ label.sentiment.upper() }}",
        "{{ label.get('sentiment') }}",
        "{{ label.items() | list }}",
        "{{ label.aspects | map(attribute='name') | join(', ') }}",
        "{% for a in label.aspects %}{{ a.name }}{% endfor %}",
        "{% set label = {'other': 1} %}{{ label.other }}",
        # a field that may be missing on purpose
        "{{ label.mood | default('none') }}",
        "{% if label.mood is defined %}{{ label.mood.x }}{% endif %}",
        # plain text, a custom output's value and an input: no declared fields to check
        "{{ answer.whatever }}",
        "{{ extra.anything.at.all }}",
        "{{ text.upper() }}",
    ],
)
def test_right_or_unknowable_paths_load(template: str) -> None:
    load(config({"x": template}))


def test_a_later_prompt_reading_a_wrong_field_is_refused() -> None:
    later = {"name": "why", "type": "llm", "prompt": "Explain {{ label.sentimnt }}: {{ text }}"}
    message = error_of(config({"why": "{{ why }}"}, later))
    assert message.startswith("paths.yaml: processing_params.outputs[3].prompt: ")
    assert "reads label.sentimnt" in message and "(did you mean 'sentiment'?)" in message


def test_a_later_prompt_reading_a_right_field_loads() -> None:
    later = {"name": "why", "type": "llm", "prompt": "Explain {{ label.summary.headline }}"}
    load(config({"why": "{{ why }}"}, later))


def test_field_paths_are_read_from_the_template_tree() -> None:
    found = field_paths("{{ a.b[0].c }} {{ x[a.k] }}")
    assert found == [("a", ("b", 0, "c")), ("x", (None,)), ("a", ("k",))]
    assert field_paths("{{ a.t[1:].x }}") == [("a", ("t",))]  # cut at the slice
    assert field_paths("{{ a.b | default('') }} {{ a.b.c }}") == []  # guarded, and below it
    assert field_paths("{{ a }} and {{ b }}") == []
