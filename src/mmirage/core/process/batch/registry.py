"""Which ``BatchSubmissionAdapter`` serves a ``provider:`` name.

Built-ins (openai, anthropic, gemini) are added lazily. Custom providers register in-process
(``BatchAdapterRegistry.register``) or, for the plain CLI, through the ``mmirage.batch_providers``
entry-point group or ``MMIRAGE_BATCH_PROVIDERS=module[,module...]`` (modules imported before the
config is loaded, which register themselves on import); see ``mmirage.config.plugins``.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, ClassVar

from mmirage.config.plugins import forwarded_class, load_provider_plugins
from mmirage.config.provider_resolution import PLUGIN_ENV, normalize_provider_name
from mmirage.core.process.batch.adapter import BatchSubmissionAdapter
from mmirage.errors import UserError

logger = logging.getLogger(__name__)

_BUILT_INS = {
    "openai": "mmirage.core.process.batch.adapters.openai:OpenAIBatchAdapter",
    "anthropic": "mmirage.core.process.batch.adapters.anthropic:AnthropicBatchAdapter",
    "gemini": "mmirage.core.process.batch.adapters.gemini:GeminiBatchAdapter",
}


class UnknownBatchAdapterError(UserError, LookupError):
    """No adapter is registered for a provider name."""


class BatchAdapterRegistry:
    """Process-wide map from provider name to its adapter class."""

    _registry: ClassVar[dict[str, type[BatchSubmissionAdapter]]] = {}

    @classmethod
    def register(cls, name: str, adapter_cls: type[BatchSubmissionAdapter]) -> None:
        key = normalize_provider_name(name)
        if not key:
            raise ValueError("a batch provider needs a non-empty name")
        if not (isinstance(adapter_cls, type) and issubclass(adapter_cls, BatchSubmissionAdapter)):
            raise TypeError(
                f"cannot register {adapter_cls!r} for batch provider {key!r}: "
                "it must be a subclass of BatchSubmissionAdapter"
            )
        cls._registry[key] = adapter_cls

    @classmethod
    def resolve(cls, name: str) -> type[BatchSubmissionAdapter]:
        key = normalize_provider_name(name)
        if key in cls._registry:
            return cls._registry[key]
        forwarded = forwarded_class(key, "adapter")  # registered by the process that started us
        if forwarded is not None:
            cls.register(key, forwarded)
            return cls._registry[key]
        if key in _BUILT_INS:
            module, _, attr = _BUILT_INS[key].partition(":")
            adapter_cls: type[BatchSubmissionAdapter] = getattr(
                importlib.import_module(module), attr
            )
            cls._registry[key] = adapter_cls
            return adapter_cls
        raise UnknownBatchAdapterError(
            f"no batch adapter is registered for provider '{key}' (available: "
            f"{', '.join(cls.available())}); register one with "
            "BatchAdapterRegistry.register, an 'mmirage.batch_providers' entry point or "
            f"{PLUGIN_ENV}"
        )

    @classmethod
    def create(cls, config: Any, allow_missing_credentials: bool = False) -> BatchSubmissionAdapter:
        """An adapter for ``config`` (a ``BatchProviderConfig``), its credentials checked."""
        adapter_cls = cls.resolve(config.provider)
        credentials = adapter_cls.read_credentials(
            config.provider, allow_missing=allow_missing_credentials
        )
        return adapter_cls(credentials)

    @classmethod
    def available(cls) -> list[str]:
        return sorted(set(cls._registry) | set(_BUILT_INS))

    @classmethod
    def custom(cls) -> dict[str, type[BatchSubmissionAdapter]]:
        """The adapters registered here that are not built in (or replace a built-in)."""
        return {
            key: adapter_cls
            for key, adapter_cls in cls._registry.items()
            if _BUILT_INS.get(key) != f"{adapter_cls.__module__}:{adapter_cls.__qualname__}"
        }

    @classmethod
    def unregister(cls, name: str) -> None:
        cls._registry.pop(normalize_provider_name(name), None)

    @classmethod
    def clear(cls) -> None:
        """Forget every registration; the built-ins come back on the next lookup."""
        cls._registry.clear()


# The spec's name for the same factory.
class BatchAdapterFactory:
    @staticmethod
    def from_config(config: Any, allow_missing_credentials: bool = False) -> BatchSubmissionAdapter:
        return BatchAdapterRegistry.create(config, allow_missing_credentials)


__all__ = [
    "BatchAdapterFactory",
    "BatchAdapterRegistry",
    "UnknownBatchAdapterError",
    "load_provider_plugins",
]
