"""MMIRAGE YAML configuration: ``load_mmirage_config(path) -> MMirageConfig``.

Names are imported lazily so that ``import mmirage.config`` (and ``mmirage --help``) does not
pull in pydantic, YAML or Jinja.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmirage.config.batch_provider import (
        AnthropicBatchConfig,
        BatchProviderConfig,
        GeminiBatchConfig,
        OpenAIBatchConfig,
    )
    from mmirage.config.errors import ConfigError
    from mmirage.config.execution import ExecutionParams
    from mmirage.config.loading_params import DatasetConfig, LoadingParams
    from mmirage.config.models import MMirageConfig
    from mmirage.config.output_schema import OutputSchema, SchemaField, parse_output_schema
    from mmirage.config.processing_params import (
        BatchApiOutput,
        CustomOutput,
        ImageGenOutput,
        InputVar,
        LLMOutput,
        OutputVar,
        ProcessingParams,
    )
    from mmirage.config.processors import (
        BatchApiProcessorConfig,
        CustomProcessorConfig,
        ImageGenProcessorConfig,
        LLMProcessorConfig,
        ProcessorConfig,
        ServerArgs,
    )
    from mmirage.config.reader import load_mmirage_config, load_mmirage_config_dict

_EXPORTS = {
    "AnthropicBatchConfig": "batch_provider",
    "BatchProviderConfig": "batch_provider",
    "GeminiBatchConfig": "batch_provider",
    "OpenAIBatchConfig": "batch_provider",
    "ConfigError": "errors",
    "ExecutionParams": "execution",
    "load_mmirage_config": "reader",
    "load_mmirage_config_dict": "reader",
    "DatasetConfig": "loading_params",
    "LoadingParams": "loading_params",
    "MMirageConfig": "models",
    "OutputSchema": "output_schema",
    "SchemaField": "output_schema",
    "parse_output_schema": "output_schema",
    "BatchApiOutput": "processing_params",
    "CustomOutput": "processing_params",
    "ImageGenOutput": "processing_params",
    "InputVar": "processing_params",
    "LLMOutput": "processing_params",
    "OutputVar": "processing_params",
    "ProcessingParams": "processing_params",
    "BatchApiProcessorConfig": "processors",
    "CustomProcessorConfig": "processors",
    "ImageGenProcessorConfig": "processors",
    "LLMProcessorConfig": "processors",
    "ProcessorConfig": "processors",
    "ServerArgs": "processors",
}

__all__ = [
    "AnthropicBatchConfig",
    "BatchApiOutput",
    "BatchApiProcessorConfig",
    "BatchProviderConfig",
    "ConfigError",
    "CustomOutput",
    "CustomProcessorConfig",
    "DatasetConfig",
    "ExecutionParams",
    "GeminiBatchConfig",
    "ImageGenOutput",
    "ImageGenProcessorConfig",
    "InputVar",
    "LLMOutput",
    "LLMProcessorConfig",
    "LoadingParams",
    "MMirageConfig",
    "OpenAIBatchConfig",
    "OutputSchema",
    "OutputVar",
    "ProcessingParams",
    "ProcessorConfig",
    "SchemaField",
    "ServerArgs",
    "load_mmirage_config",
    "load_mmirage_config_dict",
    "parse_output_schema",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mmirage.config' has no attribute {name!r}")
    return getattr(import_module(f"mmirage.config.{module}"), name)
