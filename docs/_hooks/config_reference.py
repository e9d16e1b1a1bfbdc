"""MkDocs hook: the Configuration Reference's tables, generated from the config dataclasses.

``<!-- config-reference -->`` in a page becomes one table per YAML block (field, type with its
constraints, default, description). Descriptions are the fields' attribute docstrings; a field
without one, or a dataclass that the YAML reaches but no table shows, fails the build.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

from annotated_types import Ge, Gt
from mkdocs.exceptions import PluginError

from mmirage.config import fields as common
from mmirage.config.field_docs import field_descriptions, reachable_dataclasses
from mmirage.config.models import MMirageConfig
from mmirage.config.provider_resolution import BatchProviderConfigRegistry
from mmirage.config.validation import public_fields

MARKER = "<!-- config-reference -->"

# Named field types of mmirage.config.fields, shown by what they mean to a YAML author.
_NAMED_TYPES: dict[object, str] = {
    common.PathStr: "path",
    common.OptionalPathStr: "path | null",
    common.NonEmptyStr: "str (non-empty)",
}


@dataclass(frozen=True)
class Block:
    """One table: a YAML block (its heading and where it sits) and the class behind it."""

    title: str
    cls: type[Any]
    intro: str = ""
    level: int = 3
    skip: frozenset[str] = frozenset()  # fields another table shows, or not YAML keys


def blocks() -> list[Block]:
    from mmirage.config import processing_params as pp
    from mmirage.config import processors as pr
    from mmirage.config.batch_provider import BatchProviderConfig
    from mmirage.config.execution import ExecutionParams
    from mmirage.config.loading_params import DatasetConfig, LoadingParams
    from mmirage.config.ray_settings import RayParams

    providers = [
        Block(
            f"`provider: {name}`",
            BatchProviderConfigRegistry.get_config_cls(name),
            f"Besides the shared fields above, `provider: {name}` takes:",
            level=4,
            skip=frozenset(public_fields(BatchProviderConfig)),
        )
        for name in sorted(BatchProviderConfigRegistry.available(), key=_provider_order)
    ]
    return [
        Block("The top level", MMirageConfig, "A config file is a mapping of these sections.", 2),
        Block("`processors[]`: `type: llm`", pr.LLMProcessorConfig, level=3),
        Block("`server_args`", pr.ServerArgs, "Inside an `llm` processor.", 4),
        Block(
            "`processors[]`: `type: batch_api`",
            pr.BatchApiProcessorConfig,
            "The provider's fields sit inline in the processor, next to these two.",
            level=3,
            skip=frozenset({"provider_config"}),
        ),
        Block(
            "Shared provider fields",
            BatchProviderConfig,
            "Written inline in the `batch_api` processor, next to `type` and `name`; every "
            "provider takes them.",
            4,
        ),
        *providers,
        Block("`processors[]`: `type: custom`", pr.CustomProcessorConfig, level=3),
        Block("`processors[]`: `type: image_gen`", pr.ImageGenProcessorConfig, level=3),
        Block("`external`", pr.ExternalImageBackend, "Inside an `image_gen` processor.", 4),
        Block("`sglang`", pr.SGLangImageBackend, "Inside an `image_gen` processor.", 4),
        Block("`loading_params`", LoadingParams, level=2),
        Block("`datasets[]`", DatasetConfig, "Each entry of `loading_params.datasets`.", 3),
        Block("`processing_params`", pp.ProcessingParams, level=2),
        Block("`inputs[]`", pp.InputVar, "Each entry of `processing_params.inputs`.", 3),
        Block("`outputs[]`: `type: llm`", pp.LLMOutput, level=3),
        Block("`outputs[]`: `type: batch_api`", pp.BatchApiOutput, level=3),
        Block("`outputs[]`: `type: custom`", pp.CustomOutput, level=3),
        Block("`outputs[]`: `type: image_gen`", pp.ImageGenOutput, level=3),
        Block("`execution_params`", ExecutionParams, level=2),
        Block("`ray`", RayParams, "Inside `execution_params` (`mode: ray`).", 3),
    ]


def _provider_order(name: str) -> tuple[int, str]:
    built_in = ("openai", "anthropic", "gemini")  # the spec's order, then registered ones
    return (built_in.index(name) if name in built_in else len(built_in), name)


# -- types ---------------------------------------------------------------------------------


def _constraint(meta: object) -> str:
    for kind, sign in ((Ge, "≥"), (Gt, ">")):
        if isinstance(meta, kind):
            return f"{sign} {next(iter(vars(meta).values()))}"
    for attr, sign in (("ge", "≥"), ("gt", ">")):  # pydantic's FieldInfo keeps them in metadata
        for inner in getattr(meta, "metadata", ()):
            if hasattr(inner, attr):
                return f"{sign} {getattr(inner, attr)}"
    return ""


def type_text(hint: Any) -> str:
    """A field's type as a YAML author reads it: ``int ≥ 1``, ``"a" | "b"``, ``str | null``."""
    if hint in _NAMED_TYPES:
        return _NAMED_TYPES[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        base = type_text(args[0])
        limits = [text for text in map(_constraint, args[1:]) if text]
        return f"{base} {' '.join(limits)}".strip()
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = dict.fromkeys("null" if a is type(None) else type_text(a) for a in args)
        return " | ".join(parts)
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_text(a) for a in args)}]"
    if hint is Any:
        return "any"
    if dataclasses.is_dataclass(hint):
        return "mapping"
    return getattr(hint, "__name__", str(hint))


def default_text(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{json.dumps(f.default)}`"
    factory = f.default_factory
    if factory is dataclasses.MISSING:
        return "**required**"
    if factory in (list, dict):
        return f"`{json.dumps(factory())}`"
    if dataclasses.is_dataclass(factory):
        return "see below"
    return "computed (see description)"


# -- tables --------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """One table cell: one line, pipes escaped outside code spans (inside, tables skip them)."""
    pieces = " ".join(text.split()).split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(pieces))


def table(block: Block) -> str:
    cls = block.cls
    hints = typing.get_type_hints(cls, include_extras=True)
    descriptions = field_descriptions(cls)
    by_name = {f.name: f for f in dataclasses.fields(cls)}
    names = [n for n in public_fields(cls) if n not in block.skip]
    missing = [n for n in names if not descriptions.get(n, "").strip()]
    if missing:
        raise PluginError(
            f"config reference: {', '.join(f'{cls.__name__}.{n}' for n in missing)} "
            "has no description; add an attribute docstring under the field"
        )
    heading = "#" * block.level
    lines = [f"{heading} {block.title}", ""]
    if block.intro:
        lines += [block.intro, ""]
    lines += ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for name in names:
        f = by_name[name]
        lines.append(
            f"| `{name}` | {_cell(type_text(hints[name]))} | {_cell(default_text(f))} "
            f"| {_cell(descriptions[name])} |"
        )
    return "\n".join(lines) + "\n"


def reference() -> str:
    shown = blocks()
    covered = {block.cls for block in shown}
    forgotten = [c.__name__ for c in reachable_dataclasses(MMirageConfig) if c not in covered]
    if forgotten:
        raise PluginError(f"config reference: no table for {', '.join(sorted(forgotten))}")
    return "\n".join(table(block) for block in shown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
