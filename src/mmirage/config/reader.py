"""``load_mmirage_config``: YAML file (or dict) → ``MMirageConfig``, strictly checked.

Order: parse YAML → expand ``${VAR}`` in configuration values (not in templates) → build each
section (unknown keys, types, values) → cross-checks (processor selection, template variables)
→ defaults that depend on the file (``state_dir``).

Paths: ``~`` is expanded; relative paths stay relative to the working directory, where existing
configs expect them. ``loading_params.state_dir`` defaults to
``$XDG_CACHE_HOME/mmirage/state/<config stem>-<hash of the config's absolute path>``
(``~/.cache`` without XDG_CACHE_HOME), so two pipelines never share retry counts and statuses; a
dict config hashes its content instead.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llm_kit.providers import provider_names
from mmirage.config.envvars import expand_tree, format_path
from mmirage.config.errors import ConfigError
from mmirage.config.execution import ExecutionParams
from mmirage.config.loading_params import LoadingParams
from mmirage.config.models import MMirageConfig, ProcessorSelectionError, select_processor
from mmirage.config.plugins import load_processor_plugins, load_provider_plugins
from mmirage.config.processing_params import (
    OUTPUT_TYPES,
    InputVar,
    OutputVar,
    ProcessingParams,
)
from mmirage.config.processors import (
    PROCESSOR_TYPES,
    BatchApiProcessorConfig,
    ImageGenProcessorConfig,
    ProcessorConfig,
)
from mmirage.config.provider_resolution import (
    BatchProviderConfigRegistry,
    UnknownBatchProviderError,
    normalize_provider_name,
)
from mmirage.config.template_checks import check_templates
from mmirage.config.validation import build, describe_value, unknown_key_problem

_SECTIONS = ("processors", "loading_params", "processing_params", "execution_params")
_REQUIRED_SECTIONS = _SECTIONS[:3]


def load_mmirage_config(
    path: str | os.PathLike[str], env: Mapping[str, str] | None = None
) -> MMirageConfig:
    """Load and check a YAML config; any problem raises ``ConfigError``."""
    file = Path(path).expanduser()
    source = str(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "config file not found") from None
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read the config file ({exc.strerror})") from None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, "", f"is not valid YAML ({problem}{line})") from None
    return load_mmirage_config_dict(data, source=source, env=env, config_path=str(file.resolve()))


def load_mmirage_config_dict(
    data: Any,
    *,
    source: str = "<config>",
    env: Mapping[str, str] | None = None,
    config_path: str | None = None,
) -> MMirageConfig:
    """Same checks as ``load_mmirage_config`` on an already parsed mapping (tests, API users)."""
    env = os.environ if env is None else env
    if not isinstance(data, dict):
        raise ConfigError(
            source,
            "",
            "the top level must be a mapping with processors, loading_params and processing_params",
        )
    for key in data:
        if key not in _SECTIONS:
            raise ConfigError(source, str(key), unknown_key_problem(str(key), list(_SECTIONS)))
    for key in _REQUIRED_SECTIONS:
        if key not in data:
            raise ConfigError(source, key, "is required")
    # Plugins register their processor types on import, so the plain CLI knows them: all of
    # them before any type: is read when MMIRAGE_PROCESSORS names modules, else when a type is
    # not known (``_typed_entry``).
    _load_processor_plugins(source, "processors", installed=False)
    expanded = expand_tree(data, env, source)

    processors = _processors(expanded["processors"], source)
    loading = build(LoadingParams, expanded["loading_params"], ("loading_params",), source)
    processing = _processing(expanded["processing_params"], source)
    # An absent section is its defaults: no validator to compile for it (a run's start-up).
    raw_execution = expanded.get("execution_params")
    execution = (
        build(ExecutionParams, raw_execution, ("execution_params",), source)
        if raw_execution
        else ExecutionParams()
    )

    _check_processor_selection(processors, processing.outputs, source)
    check_templates(processing, source)
    if loading.state_dir is None:
        loading.state_dir = default_state_dir(config_path, data, env)
    return MMirageConfig(processors, loading, processing, execution, config_path=config_path)


def default_state_dir(config_path: str | None, data: Any, env: Mapping[str, str]) -> str:
    """A state directory of this config's own (see module docstring)."""
    if config_path is not None:
        stem, key = Path(config_path).stem, config_path
    else:
        stem, key = "config", json.dumps(data, sort_keys=True, default=str)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    cache = env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "mmirage", "state", f"{stem}-{digest}")


# -- processors ------------------------------------------------------------------------------


def _processors(raw: Any, source: str) -> list[ProcessorConfig]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            source,
            "processors",
            f"must be a non-empty list of processors, got {describe_value(raw)}",
        )
    processors = [_processor(item, ("processors", index), source) for index, item in enumerate(raw)]
    _check_processor_names(processors, source)
    return processors


def _typed_entry(
    raw: Any, path: tuple[str | int, ...], source: str, types: Mapping[str, Any]
) -> str:
    """The ``type`` of a processors[]/outputs[] entry: a mapping whose type is one of ``types``."""
    where = format_path(path)
    if not isinstance(raw, dict):
        raise ConfigError(source, where, f"must be a mapping, got {describe_value(raw)}")
    kind = raw.get("type")
    if kind is not None and kind not in types:
        _load_processor_plugins(source, f"{where}.type")
    if kind not in types:
        problem = (
            "is required" if kind is None else f"must be one of {', '.join(types)}, got {kind!r}"
        )
        raise ConfigError(source, f"{where}.type", problem)
    return str(kind)


def _load_processor_plugins(source: str, where: str, *, installed: bool = True) -> None:
    try:
        load_processor_plugins(installed=installed)
    except ImportError as exc:
        raise ConfigError(source, where, str(exc)) from None


def _processor(raw: Any, path: tuple[str | int, ...], source: str) -> ProcessorConfig:
    kind = _typed_entry(raw, path, source, PROCESSOR_TYPES)
    if kind == "batch_api":
        return _batch_api_processor(raw, path, source)
    if raw.get("message_format") not in (None, *provider_names()):
        # A plugin may register it: a provider module adds its llm_kit spec with its adapter.
        _load_plugins(path, source, "message_format")
    processor: ProcessorConfig = build(PROCESSOR_TYPES[kind], raw, path, source)
    return processor


def _load_plugins(path: tuple[str | int, ...], source: str, field: str) -> None:
    """Plugins (entry points, MMIRAGE_BATCH_PROVIDERS) register their providers on import:
    before the name is resolved, so the plain CLI knows them."""
    try:
        load_provider_plugins()
    except ImportError as exc:
        raise ConfigError(source, f"{format_path(path)}.{field}", str(exc)) from None


def _batch_api_processor(
    raw: dict[str, Any], path: tuple[str | int, ...], source: str
) -> BatchApiProcessorConfig:

    _load_plugins(path, source, "provider")
    where = format_path(path)
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise ConfigError(source, f"{where}.name", f"must be a string, got {describe_value(name)}")
    provider = raw.get("provider")
    if not isinstance(provider, str) or not provider.strip():
        raise ConfigError(
            source,
            f"{where}.provider",
            f"is required: one of {BatchProviderConfigRegistry.available()}",
        )
    try:
        config_cls = BatchProviderConfigRegistry.get_config_cls(provider)
    except UnknownBatchProviderError as exc:
        raise ConfigError(source, f"{where}.provider", str(exc)) from None
    payload = {k: v for k, v in raw.items() if k not in ("type", "name")}
    payload["provider"] = normalize_provider_name(provider)
    provider_config = build(config_cls, payload, path, source, extra=("type", "name"))
    return BatchApiProcessorConfig(provider_config=provider_config, name=name)


def _check_processor_names(processors: list[ProcessorConfig], source: str) -> None:
    seen: dict[str, int] = {}
    for index, processor in enumerate(processors):
        if processor.name is None:
            continue
        if processor.name in seen:
            raise ConfigError(
                source,
                f"processors[{index}].name",
                f"'{processor.name}' is already the name of processors[{seen[processor.name]}]; "
                "names must be unique",
            )
        seen[processor.name] = index
    by_type: dict[str, list[int]] = {}
    for index, processor in enumerate(processors):
        by_type.setdefault(processor.type, []).append(index)
    for kind, indexes in by_type.items():
        unnamed = [i for i in indexes if processors[i].name is None]
        if len(indexes) > 1 and unnamed:
            raise ConfigError(
                source,
                f"processors[{unnamed[0]}].name",
                f"is required: there are {len(indexes)} processors of type {kind}, so each needs a "
                "'name' and each output picks one with 'processor: <name>'",
            )
    sglang = [
        i
        for i, p in enumerate(processors)
        if isinstance(p, ImageGenProcessorConfig) and p.backend == "sglang"
    ]
    if len(sglang) > 1:
        raise ConfigError(
            source,
            f"processors[{sglang[1]}].backend",
            "at most one image_gen processor may use backend sglang",
        )


# -- processing_params -----------------------------------------------------------------------


def _processing(raw: Any, source: str) -> ProcessingParams:
    path = ("processing_params",)
    if not isinstance(raw, dict):
        raise ConfigError(
            source, "processing_params", f"must be a mapping, got {describe_value(raw)}"
        )
    for key in ("inputs", "outputs", "output_schema"):
        if key not in raw:
            raise ConfigError(source, f"processing_params.{key}", "is required")
    inputs_raw, outputs_raw = raw["inputs"] or [], raw["outputs"]
    if not isinstance(inputs_raw, list):
        raise ConfigError(
            source, "processing_params.inputs", f"must be a list, got {describe_value(inputs_raw)}"
        )
    if not isinstance(outputs_raw, list) or not outputs_raw:
        raise ConfigError(
            source,
            "processing_params.outputs",
            f"must be a non-empty list, got {describe_value(outputs_raw)}",
        )
    if not isinstance(raw["output_schema"], dict) or not raw["output_schema"]:
        raise ConfigError(
            source,
            "processing_params.output_schema",
            "must be a non-empty mapping of column name to template, "
            f"got {describe_value(raw['output_schema'])}",
        )
    params = build(ProcessingParams, {**raw, "inputs": [], "outputs": []}, path, source)
    params.inputs = [
        build(InputVar, item, (*path, "inputs", i), source) for i, item in enumerate(inputs_raw)
    ]
    params.outputs = [
        _output(item, (*path, "outputs", i), source) for i, item in enumerate(outputs_raw)
    ]
    _check_unique_variables(params, source)
    return params


def _output(raw: Any, path: tuple[str | int, ...], source: str) -> OutputVar:
    kind = _typed_entry(raw, path, source, OUTPUT_TYPES)
    output: OutputVar = build(OUTPUT_TYPES[kind], raw, path, source)
    return output


def _check_unique_variables(params: ProcessingParams, source: str) -> None:
    seen: dict[str, str] = {}
    named = [(f"inputs[{i}]", v.name) for i, v in enumerate(params.inputs)]
    named += [(f"outputs[{i}]", v.name) for i, v in enumerate(params.outputs)]
    for where, name in named:
        if name in seen:
            raise ConfigError(
                source,
                f"processing_params.{where}.name",
                f"'{name}' is already defined by processing_params.{seen[name]}; "
                "variable names must be unique",
            )
        seen[name] = where


def _check_processor_selection(
    processors: list[ProcessorConfig], outputs: list[OutputVar], source: str
) -> None:
    for index, output in enumerate(outputs):
        try:
            select_processor(processors, output)
        except ProcessorSelectionError as exc:
            field = "processor" if output.processor is not None else "type"
            raise ConfigError(
                source, f"processing_params.outputs[{index}].{field}", str(exc)
            ) from None
