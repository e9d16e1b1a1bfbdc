"""``build_processor``: a processor config → the processor that runs it."""

from __future__ import annotations

from typing import Any

from mmirage.config.errors import ConfigError
from mmirage.core.process.base import Processor, RunContext


def build_processor(config: Any, context: RunContext | None = None) -> Processor:
    """Build the processor for one ``processors[]`` entry; fails here, before any row runs, on
    what can be checked up front (a missing API key, script or function)."""
    kind = getattr(config, "type", None)
    if kind == "batch_api":
        from mmirage.core.process.batch.processor import BatchApiProcessor

        if context is None:
            raise ValueError("a batch_api processor needs the run's context")
        return BatchApiProcessor(config, context)
    if kind == "llm":
        from mmirage.core.process.llm_processor import LLMProcessor

        return LLMProcessor(config, context)
    if kind == "custom":
        from mmirage.core.process.custom_processor import CustomProcessor

        return CustomProcessor(config)
    name = getattr(config, "name", None) or kind
    raise ConfigError(
        f"processor '{name}'",
        "type",
        f"type {kind!r} is not supported yet by this runner (llm, batch_api and custom are)",
    )


__all__ = ["build_processor"]
