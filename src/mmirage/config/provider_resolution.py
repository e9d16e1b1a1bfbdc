"""Which ``BatchProviderConfig`` class a ``provider:`` name means.

Built-ins (openai, anthropic, gemini) are added lazily, so a user may ``clear()`` and
re-register, and registering a new provider before loading a config makes it usable in YAML.
"""

from __future__ import annotations

from typing import ClassVar

from mmirage.config.batch_provider import (
    AnthropicBatchConfig,
    BatchProviderConfig,
    GeminiBatchConfig,
    OpenAIBatchConfig,
)
from mmirage.config.plugins import PROVIDER_PLUGINS, forwarded_class
from mmirage.errors import UserError

_BUILT_INS: dict[str, type[BatchProviderConfig]] = {
    "openai": OpenAIBatchConfig,
    "anthropic": AnthropicBatchConfig,
    "gemini": GeminiBatchConfig,
}


# Where the plain CLI finds custom providers: modules imported before the config loads.
PLUGIN_GROUP = PROVIDER_PLUGINS.group
PLUGIN_ENV = PROVIDER_PLUGINS.env


def normalize_provider_name(name: str) -> str:
    return name.strip().lower()


class UnknownBatchProviderError(UserError, LookupError):
    """``provider:`` names no registered config class."""


class BatchProviderConfigRegistry:
    """Process-wide map from provider name to its config dataclass."""

    _registry: ClassVar[dict[str, type[BatchProviderConfig]]] = {}

    @classmethod
    def register(cls, name: str, config_cls: type[BatchProviderConfig]) -> None:
        key = normalize_provider_name(name)
        if not key:
            raise ValueError("a batch provider needs a non-empty name")
        if not (
            isinstance(config_cls, type)
            and issubclass(config_cls, BatchProviderConfig)
            # Its own @dataclass: a bare subclass would silently drop the fields it declares.
            and "__dataclass_fields__" in vars(config_cls)
        ):
            raise TypeError(
                f"cannot register {config_cls!r} for batch provider {key!r}: "
                "it must be a @dataclass subclass of BatchProviderConfig"
            )
        cls._add_built_ins()
        cls._registry[key] = config_cls

    @classmethod
    def get_config_cls(cls, name: str) -> type[BatchProviderConfig]:
        cls._add_built_ins()
        key = normalize_provider_name(name)
        # Registered by the process that started this one (a built-in's name included).
        if cls._registry.get(key) in (None, _BUILT_INS.get(key)) and (
            forwarded := forwarded_class(key, "config")
        ):
            cls.register(key, forwarded)
        try:
            return cls._registry[key]
        except KeyError:
            raise UnknownBatchProviderError(
                f"Unknown batch provider '{key}'. Available providers: {cls.available()}; "
                "to add one, register its config and adapter in a module named by "
                f"{PLUGIN_ENV}=your_module or an '{PLUGIN_GROUP}' entry point "
                "(see docs/batch_api.md)"
            ) from None

    # ``get_config_cls`` is the spec's name; ``resolve`` matches BatchAdapterRegistry's.
    resolve = get_config_cls

    @classmethod
    def available(cls) -> list[str]:
        cls._add_built_ins()
        return sorted(cls._registry)

    @classmethod
    def custom(cls) -> dict[str, type[BatchProviderConfig]]:
        """The providers registered here that are not built in (or replace a built-in)."""
        return {k: c for k, c in cls._registry.items() if _BUILT_INS.get(k) is not c}

    @classmethod
    def unregister(cls, name: str) -> None:
        cls._registry.pop(normalize_provider_name(name), None)

    @classmethod
    def clear(cls) -> None:
        """Forget every registration; the built-ins come back on the next lookup."""
        cls._registry.clear()

    @classmethod
    def _add_built_ins(cls) -> None:
        for key, config_cls in _BUILT_INS.items():
            cls._registry.setdefault(key, config_cls)
