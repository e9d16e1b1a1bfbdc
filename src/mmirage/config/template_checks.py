"""The templates of ``processing_params`` against what they may read, checked at load.

Every Jinja name must be an input or an earlier output (rendering "" would hide a typo in every
row), and every field path into a JSON output whose fields are declared must name declared fields
(``{{ label.sentimnt }}`` would otherwise fail every row, each one paid for). The path check only
refuses what is certainly wrong: a step it cannot judge at load (a method, a computed subscript, a
field of a scalar) ends it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from mmirage.config.envvars import format_path
from mmirage.config.errors import ConfigError
from mmirage.config.output_schema import OutputSchema, SchemaField
from mmirage.config.processing_params import BatchApiOutput, ImageGenOutput, ProcessingParams
from mmirage.config.templates import (
    Step,
    TemplateProblem,
    field_paths,
    strings_in,
    undeclared_names,
)

_TEMPLATE_FIELDS = ("prompt", "negative_prompt", "filename_template")
# Fields of a JSON output, by output name: what its value (a dict) certainly holds.
Declared = Mapping[str, tuple[SchemaField, ...]]


def check_templates(params: ProcessingParams, source: str) -> None:
    """Prompts see the inputs and earlier outputs; ``output_schema`` sees them all."""
    known = [v.name for v in params.inputs]
    declared: dict[str, tuple[SchemaField, ...]] = {}
    batch: list[str] = []  # batch_api outputs: their values exist only after merge
    for index, output in enumerate(params.outputs):
        builtins = (
            ImageGenOutput.BUILTIN_VARIABLES if isinstance(output, ImageGenOutput) else frozenset()
        )
        for field in _TEMPLATE_FIELDS:
            text = getattr(output, field, None)
            if isinstance(text, str):
                where = f"processing_params.outputs[{index}].{field}"
                _check_template(text, set(known) | builtins, declared, where, source)
                _check_no_batch_input(text, batch, where, source)
        known.append(output.name)
        schema = getattr(output, "schema", None)  # a plugin's output type may have one too
        if getattr(output, "is_json", False) and isinstance(schema, OutputSchema):
            declared[output.name] = schema.fields
        if isinstance(output, BatchApiOutput):
            _check_batch_output_name(output.name, index, source)
            batch.append(output.name)
    for sub, text in strings_in(params.output_schema):
        where = format_path(("processing_params", "output_schema", *sub))
        _check_template(text, set(known), declared, where, source)


def _check_no_batch_input(text: str, batch: list[str], where: str, source: str) -> None:
    used = sorted(undeclared_names(text) & set(batch))
    if used:
        raise ConfigError(
            source,
            where,
            f"uses '{used[0]}', a batch_api output whose value only exists after "
            "'mmirage merge'; compute this output in a second pipeline over the merged file",
        )


_BATCH_OUTPUT_NAME = re.compile(r"^[A-Za-z0-9_]{1,40}$")


def _check_batch_output_name(name: str, index: int, source: str) -> None:
    # The name starts every custom_id, which Anthropic limits to ^[A-Za-z0-9_-]{1,64}$.
    if not _BATCH_OUTPUT_NAME.match(name):
        raise ConfigError(
            source,
            f"processing_params.outputs[{index}].name",
            f"'{name}' cannot start a batch custom_id; use at most 40 letters, digits or "
            "underscores",
        )


def _check_template(
    text: str, known: set[str], declared: Declared, where: str, source: str
) -> None:
    try:
        missing = undeclared_names(text) - known
    except TemplateProblem as exc:
        raise ConfigError(source, where, str(exc)) from None
    if missing:
        names = ", ".join(f"'{n}'" for n in sorted(missing))
        available = ", ".join(sorted(known)) or "none"
        raise ConfigError(
            source,
            where,
            f"uses {names}, which is neither an input nor an earlier output; "
            f"available here: {available}",
        )
    for root, steps in field_paths(text):
        fields = declared.get(root)
        problem = None if fields is None else field_path_problem(root, steps, fields)
        if problem is not None:
            raise ConfigError(source, where, problem)


def field_path_problem(
    root: str, steps: tuple[Step, ...], fields: tuple[SchemaField, ...]
) -> str | None:
    """Why ``root`` + ``steps`` certainly reads no declared field of the JSON output ``root``;
    ``None`` when it does, or when load time cannot tell."""
    node = SchemaField(root, "object", properties=fields)
    read, inside = root, ""  # the path as written; the declared field it is in
    for step in steps:
        if node.type == "list" and node.items is not None and not isinstance(step, str):
            node, read, inside = node.items, read + _index(step), inside + "[]"
            continue
        if node.type != "object" or not isinstance(step, str):
            return None  # a scalar's method, a key computed per row, an index into an object
        by_name = {f.name: f for f in node.properties}
        if step in by_name:
            node, read, inside = by_name[step], read + _key(step), _join(inside, step)
            continue
        if hasattr(dict, step):
            return None  # label.items(), label.get("x"): the dict's own methods
        return _unknown_field(root, read + _key(step), inside, step, list(by_name))
    return None


def _unknown_field(root: str, read: str, inside: str, step: str, names: list[str]) -> str:
    import difflib  # only to word an error

    close = difflib.get_close_matches(step, names, n=1)
    hint = (
        f" (did you mean '{_join(inside, close[0])}'?)"
        if close
        else f"; declared there: {', '.join(names)}"
    )
    return f"reads {read}, but output '{root}' declares no field '{_join(inside, step)}'{hint}"


def _key(step: str) -> str:
    return f".{step}" if step.isidentifier() else f"[{step!r}]"


def _index(step: int | None) -> str:
    return f"[{step}]" if step is not None else "[...]"


def _join(inside: str, name: str) -> str:
    return f"{inside}.{name}" if inside else name
