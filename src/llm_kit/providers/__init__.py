"""Every provider llm_kit talks to: its codec (wire format), batch backend and key variables,
one ``ProviderSpec`` each in ``llm_kit.providers.registry``.

Importing this package registers the built-in providers; a new one is a module that calls
``register_provider`` (see docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

# isort: off
# Import order is registration order, the order messages list the formats in.
from llm_kit.providers import openai
from llm_kit.providers import anthropic
from llm_kit.providers import gemini
from llm_kit.providers import local

# isort: on
from llm_kit.providers.base import Backend, Codec
from llm_kit.providers.registry import (
    ProviderSpec,
    batch_provider_names,
    cut_finish_reasons,
    get_codec,
    key_from_env,
    provider_names,
    provider_spec,
    register_provider,
    require_key,
)
from llm_kit.types import Completion, RateLimitInfo

BUILT_IN = (openai.OPENAI, anthropic.ANTHROPIC, gemini.GEMINI, local.LOCAL)


def __getattr__(name: str) -> Any:
    # Compatibility names for callers of the former constant tables, computed on each access
    # so that they include providers registered later.
    if name == "MESSAGE_FORMATS":
        return provider_names()
    if name == "CODECS":
        return {
            spec.name: spec.codec for spec in map(provider_spec, provider_names()) if spec.codec
        }
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BUILT_IN",
    "Backend",
    "Codec",
    "Completion",
    "ProviderSpec",
    "RateLimitInfo",
    "batch_provider_names",
    "cut_finish_reasons",
    "get_codec",
    "key_from_env",
    "provider_names",
    "provider_spec",
    "register_provider",
    "require_key",
]
