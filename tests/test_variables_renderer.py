"""Per-row logic: input variables (JMESPath, images), prompt rendering, the output-schema
renderer (types kept for a bare ``{{ var }}``, placeholders re-rendered at merge)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mmirage.config.processing_params import InputVar
from mmirage.core.render.prompts import compile_template, render_prompt
from mmirage.core.render.renderer import (
    OutputRenderer,
    fill_placeholders,
    find_placeholders,
    make_placeholder,
    placeholder_id,
    render_row,
    render_value,
    schema_variables,
)
from mmirage.core.render.variables import (
    RowError,
    VariableExtractor,
    compile_key,
    extract_variables,
    image_urls,
    resolve_image,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16
ROW: dict[str, Any] = {
    "id": 7,
    "meta": {"source": {"name": "wiki"}},
    "turns": [{"role": "user", "text": "hi"}, {"role": "assistant", "text": "hello"}],
    "zero": 0,
    "empty": "",
    "flag": False,
    "nothing": None,
}


# --- variables -------------------------------------------------------------------------------


def test_jmespath_nested_keys_and_projections() -> None:
    inputs = [
        InputVar("source", "meta.source.name"),
        InputVar("texts", "turns[*].text"),
        InputVar("first", "turns[0].text"),
        InputVar("users", "turns[?role=='user'].text"),
        InputVar("row_id", "id"),
    ]
    assert extract_variables(ROW, inputs) == {
        "source": "wiki",
        "texts": ["hi", "hello"],
        "first": "hi",
        "users": ["hi"],
        "row_id": 7,
    }


def test_falsy_values_are_not_missing() -> None:
    inputs = [InputVar("z", "zero"), InputVar("e", "empty"), InputVar("f", "flag")]
    assert extract_variables(ROW, inputs) == {"z": 0, "e": "", "f": False}


@pytest.mark.parametrize("key", ["meta.source.missing", "nothing", "turns[5].text"])
def test_missing_or_null_field_is_a_row_error_naming_variable_and_key(key: str) -> None:
    with pytest.raises(RowError) as err:
        extract_variables(ROW, [InputVar("x", "id"), InputVar("caption", key)])
    assert err.value.variable == "caption"
    assert err.value.key == key
    assert "'caption'" in str(err.value) and f"'{key}'" in str(err.value)
    assert "optional" in str(err.value)  # says what to do


def test_optional_input_becomes_none() -> None:
    extractor = VariableExtractor([InputVar("caption", "nothing")], optional={"caption"})
    assert extractor.extract(ROW) == {"caption": None}


def test_optional_attribute_on_the_input_is_honoured() -> None:
    @dataclass
    class OptionalInput:  # the shape InputVar takes once the config layer adds `optional`
        name: str
        key: str
        type: str = "text"
        optional: bool = False

    extractor = VariableExtractor(
        [OptionalInput("a", "missing", optional=True), OptionalInput("b", "id")]
    )
    assert extractor.extract(ROW) == {"a": None, "b": 7}
    with pytest.raises(RowError):
        VariableExtractor([OptionalInput("a", "missing")]).extract(ROW)


class _Row(Mapping[str, Any]):
    """A row that is a Mapping but not a dict (what a reader might hand over)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


@pytest.mark.parametrize(
    "inputs",
    [
        [InputVar("text", "text")],
        [InputVar("text", "text"), InputVar("n", "n")],
        [InputVar("text", "text"), InputVar("source", "meta.source")],  # not a plain column
        [],
    ],
)
@pytest.mark.parametrize("wrap", [dict, _Row])
def test_extract_each_is_extract_for_every_row(inputs: list[InputVar], wrap: Any) -> None:
    rows = [
        {"text": "a", "n": 1, "meta": {"source": "x"}},
        {"text": None, "n": 2, "meta": {"source": "y"}},  # required text missing
        {"text": "c", "meta": {"source": "z"}},  # n missing
        {"text": "", "n": 0, "meta": {}},  # falsy values are values; meta.source missing
    ]
    extractor = VariableExtractor(inputs, optional={"n"})
    values, errors = extractor.extract_each([wrap(row) for row in rows])
    assert len(values) == len(rows)
    for index, row in enumerate(rows):
        try:
            expected = extractor.extract(row)
        except RowError as exc:
            assert values[index] is None and str(errors[index]) == str(exc)
        else:
            assert values[index] == expected and index not in errors
    if inputs:
        assert 1 in errors and "input variable 'text'" in str(errors[1])


class _Ambiguous:
    """Compares like a numpy array: ``==`` has no single truth value."""

    def __eq__(self, other: object) -> bool:
        raise ValueError("the truth value of an array is ambiguous")

    __hash__ = object.__hash__


def test_extract_each_takes_values_that_cannot_be_compared() -> None:
    value = _Ambiguous()
    extractor = VariableExtractor([InputVar("a", "a")])
    values, errors = extractor.extract_each([{"a": value}, {"a": None}])
    assert values[0] is not None and values[0]["a"] is value
    assert values[1] is None and "input variable 'a'" in str(errors[1])


def test_keys_are_compiled_once() -> None:
    assert compile_key("meta.source.name") is compile_key("meta.source.name")


def test_image_paths_are_resolved(tmp_path: Path) -> None:
    base = tmp_path / "images"
    base.mkdir()
    (base / "a.png").write_bytes(PNG)
    (base / "b.png").write_bytes(PNG)
    absolute = str(base / "b.png")
    row = {
        "rel": "a.png",
        "abs": absolute,
        "file": f"file://{absolute}",
        "url": "https://example.org/x.jpg",
        "data": "data:image/png;base64,AAAA",
        "many": ["a.png", absolute, "http://example.org/y.png"],
    }
    inputs = [InputVar(name, name, type="image") for name in row]
    out = extract_variables(row, inputs, image_base_path=str(base))
    assert out == {
        "rel": str(base / "a.png"),
        "abs": absolute,
        "file": absolute,
        "url": "https://example.org/x.jpg",
        "data": "data:image/png;base64,AAAA",
        "many": [str(base / "a.png"), absolute, "http://example.org/y.png"],
    }
    assert image_urls(out, ["rel", "many"]) == [out["rel"], *out["many"]]


def test_relative_image_without_base_path_uses_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "c.png").write_bytes(PNG)
    monkeypatch.chdir(tmp_path)
    assert resolve_image("c.png", "img") == os.path.join(str(tmp_path), "c.png")


def test_missing_image_is_a_row_error_naming_variable_and_path(tmp_path: Path) -> None:
    inputs = [InputVar("picture", "img", type="image")]
    with pytest.raises(RowError) as err:
        extract_variables({"img": "nope.png"}, inputs, image_base_path=str(tmp_path))
    expected = str(tmp_path / "nope.png")
    assert err.value.variable == "picture"
    assert err.value.path == expected
    assert "'picture'" in str(err.value) and expected in str(err.value)
    with pytest.raises(RowError, match="picture"):  # one missing file in a list fails the row
        extract_variables({"img": ["nope.png"]}, inputs, image_base_path=str(tmp_path))


def test_image_bytes_become_a_data_url_and_other_types_fail() -> None:
    url = resolve_image({"bytes": PNG, "path": "x.bin"}, "img")
    assert url == "data:image/png;base64," + base64.b64encode(PNG).decode()
    with pytest.raises(RowError, match="must be a path or URL string"):
        resolve_image(42, "img")


# --- prompts ---------------------------------------------------------------------------------


def test_prompt_renders_variables_without_escaping() -> None:
    assert render_prompt("Q: {{ q }} <{{ n + 1 }}>", {"q": "a & <b>", "n": 1}) == "Q: a & <b> <2>"


def test_prompt_undefined_name_is_a_row_error() -> None:
    with pytest.raises(RowError) as err:
        render_prompt("Describe {{ caption }}", {"title": "x"})
    assert err.value.variable == "caption"
    assert "title" in str(err.value)  # lists what is available
    with pytest.raises(RowError):  # {% if %} on an undefined name too: no silent branch
        render_prompt("{% if caption %}x{% endif %}", {})


def test_prompt_keeps_trailing_newlines_like_the_original() -> None:
    # Jinja's default, which the original used: one trailing newline of the template is dropped.
    assert render_prompt("Answer:\n{{ q }}\n", {"q": "why"}) == "Answer:\nwhy"
    assert render_prompt("{{ q }}\n\n", {"q": "why"}) == "why\n"


def test_prompt_none_renders_empty_and_template_is_cached() -> None:
    assert render_prompt("[{{ opt }}]", {"opt": None}) == "[]"
    assert compile_template("{{ a }}") is compile_template("{{ a }}")


def test_prompt_errors_split_config_from_row() -> None:
    with pytest.raises(ValueError, match="not valid Jinja") as err:
        render_prompt("{{ a ", {"a": 1})
    assert not isinstance(err.value, RowError)
    with pytest.raises(RowError, match="prompt"):
        render_prompt("{{ n + 1 }}", {"n": "text"})


# --- output schema ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["text", 3, 2.5, True, False, None, [1, "a", None], {"k": [1, {"x": 2.0}]}]
)
@pytest.mark.parametrize("template", ["{{ v }}", "{{v}}", "  {{   v  }}\n", "{{- v -}}"])
def test_bare_variable_keeps_its_type(value: Any, template: str) -> None:
    out = render_value(template, {"v": value})
    assert out == value
    assert type(out) is type(value)


def test_bare_variable_returns_the_object_itself() -> None:
    parsed = {"question": "q", "score": 4}
    assert render_value("{{ out }}", {"out": parsed}) is parsed


def test_dotted_field_keeps_its_type() -> None:
    variables = {"out": {"score": 4, "ok": True, "items": [1, 2], "inner": {"p": 0.5}}}
    assert render_value("{{ out.score }}", variables) == 4
    assert render_value("{{ out.ok }}", variables) is True
    assert render_value("{{ out.items }}", variables) == [1, 2]  # the field, not dict.items
    assert render_value("{{ out.inner.p }}", variables) == 0.5
    with pytest.raises(RowError, match="no field 'missing'"):
        render_value("{{ out.inner.missing }}", variables)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{{ n }} items", "3 items"),
        ("{{ n + 1 }}", "4"),
        ("{{ flag }}!", "False!"),
        ("{{ word | upper }}", "HI"),
        ("{{ true }}", "True"),
        ("{{ opt }}-", "-"),
        ("plain text", "plain text"),
    ],
)
def test_other_templates_render_to_strings(template: str, expected: str) -> None:
    variables = {"n": 3, "flag": False, "word": "hi", "opt": None}
    assert render_value(template, variables) == expected


@pytest.mark.parametrize("template", ["{{ missing }}", "x {{ missing }}"])
def test_undefined_in_schema_is_a_row_error_with_its_path(template: str) -> None:
    with pytest.raises(RowError) as err:
        render_row({"a": {"b": [template]}}, {"x": 1})
    assert err.value.variable == "missing"
    assert err.value.path == "output_schema.a.b[0]"
    assert "output_schema.a.b[0]" in str(err.value)


def test_nested_schema_recurses_and_keeps_constants() -> None:
    schema = {
        "conversations": [
            {"role": "user", "content": "{{ q }}"},
            {"role": "assistant", "content": "{{ a }}"},
        ],
        "meta": {"score": "{{ s }}", "label": "s={{ s }}", "version": 2, "draft": False},
    }
    assert render_row(schema, {"q": "Q?", "a": "A.", "s": 5}) == {
        "conversations": [
            {"role": "user", "content": "Q?"},
            {"role": "assistant", "content": "A."},
        ],
        "meta": {"score": 5, "label": "s=5", "version": 2, "draft": False},
    }


def test_remove_columns_false_keeps_and_overwrites_original_columns() -> None:
    row = {"id": 1, "text": "old", "extra": [1]}
    out = OutputRenderer({"text": "{{ new }}", "added": "{{ id }}"}).render(
        {"new": "fresh", "id": 1}, row
    )
    assert out == {"id": 1, "text": "fresh", "extra": [1], "added": 1}
    assert list(out) == ["id", "text", "extra", "added"]
    assert row["text"] == "old"  # the input row is not mutated


def test_remove_columns_true_keeps_only_schema_keys() -> None:
    renderer = OutputRenderer({"text": "{{ new }}"}, remove_columns=True)
    assert renderer.render({"new": "fresh"}, {"id": 1, "text": "old"}) == {"text": "fresh"}


SCHEMA: dict[str, Any] = {
    "question": "{{ question }}",
    "answer": "{{ answer }}",
    "summary": "Q: {{ question }} A: {{ answer }}",
    "score": "{{ judged.score }}",
    "nested": [{"a": "{{ answer }}", "q": "{{ question | upper }}"}],
}


def test_placeholder_round_trip() -> None:
    renderer = OutputRenderer(SCHEMA, remove_columns=True)
    pending_answer = make_placeholder("answer-text-1")
    pending_judged = make_placeholder("judged-text-2")
    submitted = {"question": "why?", "answer": pending_answer, "judged": pending_judged}

    first = renderer.render(submitted)
    assert first == {
        "question": "why?",
        "answer": pending_answer,
        "summary": pending_answer,  # a leaf reading a pending output is pending
        "score": pending_judged,
        "nested": [{"a": pending_answer, "q": "WHY?"}],
    }
    assert renderer.render(submitted) == first  # deterministic
    assert find_placeholders(first) == [pending_answer] * 2 + [pending_judged, pending_answer]
    assert placeholder_id(pending_answer) == "answer-text-1"

    results = {"answer-text-1": "because", "judged-text-2": {"score": 9}}
    merged = fill_placeholders(submitted, results)
    real = {"question": "why?", "answer": "because", "judged": {"score": 9}}
    assert merged == real
    assert renderer.render(merged) == renderer.render(real)
    assert renderer.render(merged)["score"] == 9
    assert renderer.render(merged)["summary"] == "Q: why? A: because"
    assert find_placeholders(renderer.render(merged)) == []


def test_placeholder_without_result_stays_pending() -> None:
    pending = make_placeholder("answer-text-3")
    filled = fill_placeholders({"answer": pending}, {"answer-text-1": "x"})
    assert filled == {"answer": pending}
    assert render_value("{{ answer }}!", filled) == pending


def test_schema_variables_in_order_without_locals_or_globals() -> None:
    schema = {
        "a": "{{ b }} {{ a }}",
        "list": ["{% for t in turns %}{{ t }}{{ sep }}{% endfor %}"],
        "r": "{{ range(n) | list }}",
        "c": "{{ out.field }}",
        "dup": "{{ a }}",
        "n": 3,
    }
    assert schema_variables(schema) == ["b", "a", "turns", "sep", "n", "out"]
    assert OutputRenderer(schema).variables == schema_variables(schema)
    assert schema_variables(SCHEMA) == ["question", "answer", "judged"]


def test_bad_schema_fails_when_built_not_per_row() -> None:
    with pytest.raises(ValueError, match="not valid Jinja"):
        OutputRenderer({"a": "{{ broken "})
    with pytest.raises(ValueError, match="must be a mapping"):
        OutputRenderer(["{{ a }}"])  # type: ignore[arg-type]


def test_optional_comes_from_the_config() -> None:
    from mmirage.config import load_mmirage_config_dict
    from mmirage.core.render.variables import VariableExtractor

    config = load_mmirage_config_dict(
        {
            "processors": [{"type": "custom", "script_path": __file__, "function_name": "f"}],
            "loading_params": {
                "datasets": [{"type": "JSONL", "path": "x.jsonl", "output_dir": "o"}]
            },
            "processing_params": {
                "inputs": [{"name": "maybe", "key": "a.b", "optional": True}],
                "outputs": [{"name": "out", "type": "custom"}],
                "output_schema": {"m": "{{ maybe }}"},
            },
        }
    )
    extractor = VariableExtractor(config.processing_params.inputs)
    assert extractor.extract({"a": {}}) == {"maybe": None}


@pytest.mark.parametrize("remove_columns", [False, True])
def test_render_each_of_bare_names_is_render_for_every_row(remove_columns: bool) -> None:
    # Every column a bare {{ name }}: the rows are copied the short way, with the same result
    # as rendering each; a row that lacks a variable still fails alone, naming it.
    renderer = OutputRenderer(
        {"text": "{{ new }}", "added": "{{ id }}"}, remove_columns=remove_columns
    )
    rows = [{"id": i, "text": "old", "extra": [i]} for i in range(3)]
    good = [{"new": f"fresh {i}", "id": i} for i in range(3)]
    out, errors = renderer.render_each(good, rows)
    assert errors == {}
    assert out == [renderer.render(v, r) for v, r in zip(good, rows, strict=True)]
    assert [list(o or ()) for o in out] == [list(renderer.render(good[0], rows[0]))] * 3
    lacking = [good[0], {"id": 1}, good[2]]
    out, errors = renderer.render_each(lacking, rows)
    assert out[0] == renderer.render(good[0], rows[0]) and out[1] is None
    assert set(errors) == {1} and "new" in str(errors[1])
