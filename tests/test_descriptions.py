"""Every YAML field, CLI command and option, and public llm_kit name has a description: the
docs' reference pages are generated from them, and a missing one fails the docs build."""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field

import click
from pydantic import BaseModel

import llm_kit
import llm_kit.batch
from mmirage.cli import main
from mmirage.config.batch_provider import BatchProviderConfig
from mmirage.config.field_docs import field_descriptions, reachable_dataclasses, yaml_fields
from mmirage.config.models import MMirageConfig
from mmirage.config.processing_params import OUTPUT_TYPES
from mmirage.config.processors import PROCESSOR_TYPES
from mmirage.config.provider_resolution import BatchProviderConfigRegistry

# -- field_descriptions itself ----------------------------------------------------------------


@dataclass
class _Base:
    """A base."""

    plain: int = 1
    """Described
    over two lines."""
    inherited: str = ""
    """From the base."""
    overridden: str = ""
    """The base's words."""
    undocumented: int = 0
    # A comment is not a description.
    after_comment: int = 0


@dataclass
class _Child(_Base):
    inherited: str = "redeclared without a docstring"
    overridden: str = "x"
    """The child's words."""
    extra: list[str] = field(default_factory=list)
    """Only in the child."""


def test_field_descriptions_reads_attribute_docstrings_along_the_mro() -> None:
    assert field_descriptions(_Child) == {
        "plain": "Described\nover two lines.",
        "inherited": "From the base.",
        "overridden": "The child's words.",
        "extra": "Only in the child.",
    }
    assert field_descriptions(_Base)["overridden"] == "The base's words."


def test_field_descriptions_of_a_class_without_source_is_empty() -> None:
    assert field_descriptions(type("Made", (), {})) == {}


def test_yaml_fields_leave_out_internal_and_computed_fields() -> None:
    names = {f.name for f in yaml_fields(MMirageConfig)}
    assert "config_path" not in names
    assert {"processors", "loading_params", "processing_params", "execution_params"} <= names


# -- config classes ---------------------------------------------------------------------------


def _config_classes() -> list[type]:
    # Registries are process-wide: classes other tests register (mistral, shout) are theirs.
    registered = [
        BatchProviderConfigRegistry.get_config_cls(name)
        for name in BatchProviderConfigRegistry.available()
    ]
    roots = [MMirageConfig, BatchProviderConfig, *registered]
    roots += [*PROCESSOR_TYPES.values(), *OUTPUT_TYPES.values()]
    return [c for c in reachable_dataclasses(*roots) if c.__module__.startswith("mmirage.")]


def _has_own_docstring(cls: type) -> bool:
    doc = cls.__doc__ or ""
    # @dataclass writes "Name(field: type, ...)" into a class without a docstring.
    return bool(doc.strip()) and not doc.startswith(f"{cls.__name__}(")


def test_the_walk_reaches_every_yaml_section() -> None:
    names = {c.__name__ for c in _config_classes()}
    assert {
        "MMirageConfig",
        "LLMProcessorConfig",
        "ServerArgs",
        "BatchApiProcessorConfig",
        "OpenAIBatchConfig",
        "AnthropicBatchConfig",
        "GeminiBatchConfig",
        "CustomProcessorConfig",
        "ImageGenProcessorConfig",
        "ExternalImageBackend",
        "SGLangImageBackend",
        "LoadingParams",
        "DatasetConfig",
        "ProcessingParams",
        "InputVar",
        "LLMOutput",
        "BatchApiOutput",
        "CustomOutput",
        "ImageGenOutput",
        "ExecutionParams",
    } <= names


def test_every_config_field_has_a_description() -> None:
    missing = []
    for cls in _config_classes():
        if not _has_own_docstring(cls):
            missing.append(f"{cls.__name__} (class docstring)")
        described = field_descriptions(cls)
        missing += [
            f"{cls.__name__}.{f.name}" for f in yaml_fields(cls) if not described.get(f.name)
        ]
    assert not missing, f"config fields without a description: {missing}"


# -- CLI --------------------------------------------------------------------------------------


def _commands(command: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):  # a lazy group imports each as it is asked
            sub = command.get_command(ctx, name)
            assert sub is not None, f"{path} lists {name} but cannot load it"
            yield from _commands(sub, f"{path} {name}")


def test_every_command_option_and_argument_is_described() -> None:
    missing = []
    for path, command in _commands(main, "mmirage"):
        help_text = (command.help or "").strip()
        if not help_text:
            missing.append(f"{path} (help)")
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden and not param.help:
                missing.append(f"{path} {'/'.join(param.opts)}")
            if isinstance(param, click.Argument):
                metavar = (param.name or "").upper()
                if metavar not in help_text:
                    missing.append(f"{path} {metavar} (argument not named in the help)")
    assert not missing, f"CLI without a description: {missing}"


# -- llm_kit public API -----------------------------------------------------------------------


def _public_objects() -> dict[str, object]:
    found: dict[str, object] = {}
    for module in (llm_kit, llm_kit.batch):
        for name in module.__all__:
            found.setdefault(name, getattr(module, name))
    return found


def _public_methods(cls: type) -> Iterator[tuple[str, object]]:
    for klass in cls.__mro__:
        if not klass.__module__.startswith("llm_kit"):
            continue  # Exception, BaseModel ...: documented where they live
        for name, value in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if isinstance(value, property):
                value = value.fget
            if inspect.isfunction(value):
                yield name, value


def _fields(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    if issubclass(cls, BaseModel):
        return list(cls.model_fields)
    if issubclass(cls, enum.Enum):
        return [member.name for member in cls]
    return []


def test_every_public_llm_kit_name_method_and_field_has_a_docstring() -> None:
    missing = []
    for name, obj in _public_objects().items():
        documented = _has_own_docstring(obj) if inspect.isclass(obj) else inspect.getdoc(obj)
        if not documented:
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        described = field_descriptions(obj)
        missing += [f"{name}.{f} (field)" for f in _fields(obj) if not described.get(f)]
        missing += [
            f"{name}.{method}()"
            for method, fn in _public_methods(obj)
            if not (getattr(fn, "__doc__", None) or "").strip()
        ]
    assert not missing, f"public llm_kit names without a docstring: {missing}"


def test_the_spec_page_names_are_public() -> None:
    public = _public_objects()
    for name in ("BatchItem", "BatchResult", "BatchConfig", "BatchJob", "BatchJobStatus", "LLM"):
        assert name in public
    for method in ("batch_stream", "batch_to_jsonl", "batch_to_callback", "run_batch_api"):
        assert (getattr(llm_kit.LLM, method).__doc__ or "").strip(), method
