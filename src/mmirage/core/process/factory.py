"""``build_processor``: a processor config → the processor that runs it."""

from __future__ import annotations

from typing import Any

from mmirage.config.errors import ConfigError
from mmirage.core.process.base import Processor, RunContext
from mmirage.core.process.registry import ProcessorRegistry


def build_processor(config: Any, context: RunContext | None = None) -> Processor:
    """Build the processor for one ``processors[]`` entry; fails here, before any row runs, on
    what can be checked up front (a missing API key, script or function)."""
    kind = getattr(config, "type", None)
    processor_cls = ProcessorRegistry.resolve(kind) if isinstance(kind, str) else None
    if processor_cls is None:
        name = getattr(config, "name", None) or kind
        *others, last = ProcessorRegistry.available()
        raise ConfigError(
            f"processor '{name}'",
            "type",
            f"type {kind!r} is not supported yet by this runner "
            f"({', '.join(others)} and {last} are)",
        )
    return processor_cls.from_config(config, context)


__all__ = ["build_processor"]
