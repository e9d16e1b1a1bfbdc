"""Which ``BatchSubmissionAdapter`` serves a ``provider:`` name.

Built-ins (openai, anthropic, gemini) are added lazily. Custom providers register in-process
(``BatchAdapterRegistry.register``) or, for the plain CLI, through the ``mmirage.batch_providers``
entry-point group or ``MMIRAGE_BATCH_PROVIDERS=module[,module...]`` (modules imported before the
config is loaded, which register themselves on import); see ``mmirage.config.plugins``.
"""

from __future__ import annotations

import importlib
import inspect
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
        adapter = build_adapter(adapter_cls, config.provider, credentials)
        adapter.credentials = credentials  # whatever its constructor did (or skipped)
        return adapter

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


def build_adapter(
    adapter_cls: type[BatchSubmissionAdapter], provider: str, credentials: dict[str, str]
) -> BatchSubmissionAdapter:
    """``adapter_cls()``, as the original built adapters (``adapter_cls(credentials)`` for a
    constructor that asks for them alone); one whose constructor wants a value for another
    parameter without a default is a ``UserError`` naming the class and the parameters."""
    try:
        signature = inspect.signature(adapter_cls)
    except (TypeError, ValueError):  # no signature to read: try it
        signature = None
    if signature is not None:
        needed = [
            name
            for name, p in signature.parameters.items()
            if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        if needed == ["credentials"]:
            return _built(adapter_cls, provider, credentials)
        if needed:
            raise UserError(
                f"the batch adapter {adapter_cls.__qualname__} of provider '{provider}' cannot "
                f"be built: its constructor needs {', '.join(needed)}; give "
                f"{'them' if len(needed) > 1 else 'it'} a default (mmirage builds adapters "
                "with no argument and sets .credentials from the environment)"
            )
    return _built(adapter_cls, provider)


def _built(
    adapter_cls: type[BatchSubmissionAdapter], provider: str, *args: Any
) -> BatchSubmissionAdapter:
    try:
        return adapter_cls(*args)
    except Exception as exc:
        raise UserError(
            f"the batch adapter {adapter_cls.__qualname__} of provider '{provider}' failed to "
            f"build ({type(exc).__name__}: {exc}); fix its constructor"
        ) from exc


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
