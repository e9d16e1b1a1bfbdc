"""Which ``Processor`` class runs a ``processors[]`` entry, keyed by its ``type``.

The built-ins (llm, batch_api, custom) are imported on first use: a command that runs no
shard does not pay for their dependencies. A new type needs a config dataclass, an output
dataclass and a ``Processor`` subclass, registered together with ``register_processor_type``;
for the plain CLI, from a module named by ``MMIRAGE_PROCESSORS`` or a ``mmirage.processors``
entry point (``mmirage.config.plugins``).
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from mmirage.config.processor_types import register_processor_config
from mmirage.core.process.base import Processor

_BUILT_INS = {
    "llm": "mmirage.core.process.llm_processor:LLMProcessor",
    "batch_api": "mmirage.core.process.batch.processor:BatchApiProcessor",
    "custom": "mmirage.core.process.custom_processor:CustomProcessor",
}


class ProcessorRegistry:
    """Process-wide map from processor type to the class that runs it."""

    _registry: ClassVar[dict[str, type[Processor]]] = {}

    @classmethod
    def register(cls, kind: str, processor_cls: type[Processor]) -> None:
        if not (isinstance(processor_cls, type) and issubclass(processor_cls, Processor)):
            raise TypeError(
                f"cannot register {processor_cls!r} for processor type {kind!r}: "
                "it must be a subclass of mmirage.core.process.Processor"
            )
        cls._registry[kind] = processor_cls

    @classmethod
    def resolve(cls, kind: str) -> type[Processor] | None:
        """The class for ``kind``, or None when no processor runs that type."""
        found = cls._registry.get(kind)
        if found is None and kind in _BUILT_INS:
            module, _, attr = _BUILT_INS[kind].partition(":")
            found = getattr(importlib.import_module(module), attr)
            cls._registry[kind] = found
        return found

    @classmethod
    def available(cls) -> list[str]:
        return [*_BUILT_INS, *(k for k in cls._registry if k not in _BUILT_INS)]

    @classmethod
    def unregister(cls, kind: str) -> None:
        cls._registry.pop(kind, None)


def register_processor_type(
    config_cls: type[Any], output_cls: type[Any], processor_cls: type[Processor]
) -> str:
    """Make ``type: <config_cls.TYPE>`` usable in YAML (processors[] and outputs[]) and run
    by ``processor_cls``; returns the type name."""
    kind = register_processor_config(config_cls, output_cls)
    ProcessorRegistry.register(kind, processor_cls)
    return kind


__all__ = ["ProcessorRegistry", "register_processor_type"]
