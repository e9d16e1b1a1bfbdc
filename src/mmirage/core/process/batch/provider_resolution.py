"""The spec's import path for the provider-config registry (``mmirage.config.provider_resolution``,
where the config loader reads it)."""

from mmirage.config.provider_resolution import (
    PLUGIN_ENV,
    PLUGIN_GROUP,
    BatchProviderConfigRegistry,
    UnknownBatchProviderError,
    normalize_provider_name,
)

__all__ = [
    "PLUGIN_ENV",
    "PLUGIN_GROUP",
    "BatchProviderConfigRegistry",
    "UnknownBatchProviderError",
    "normalize_provider_name",
]
