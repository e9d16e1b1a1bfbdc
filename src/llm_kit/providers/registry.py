"""Every provider llm_kit can talk to, one ``ProviderSpec`` each, keyed by its name.

The name is what ``LLM(message_format=...)`` and a batch job's ``provider`` say. Each provider
module registers its own spec when imported (``llm_kit.providers`` imports the built-in ones),
so adding a provider means adding one module that calls ``register_provider``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llm_kit.errors import ConfigError, MissingAPIKeyError
from llm_kit.providers.base import Backend, Codec

if TYPE_CHECKING:
    from llm_kit.providers.batch_backend import BatchBackend
    from llm_kit.types import BatchConfig


@dataclass(frozen=True)
class ProviderSpec:
    """What llm_kit knows about one provider.

    A provider reached over HTTP names its ``codec`` (its wire format, home URL and whether
    it takes structured-output dialects) and the environment variables its key is read from,
    tried in order. An in-process one (``local``) gives ``in_process`` instead: called with
    the model name and the ``BatchConfig`` when the ``LLM`` is built, it checks the model can
    run here (so a missing install fails before any item) and returns the function that opens
    its backend.
    ``batch_backend`` is the provider's batch API, when it has one.
    """

    name: str
    codec: type[Codec] | None = None
    key_env: tuple[str, ...] = ()
    batch_backend: type[BatchBackend] | None = None
    in_process: Callable[[str, BatchConfig], Callable[[], Backend]] | None = None

    def __post_init__(self) -> None:
        if (self.codec is None) == (self.in_process is None):
            raise ValueError(f"provider {self.name!r} needs exactly one of codec and in_process")
        if self.codec is not None and not self.key_env:
            raise ValueError(f"provider {self.name!r} needs the variable(s) its key is read from")

    @property
    def base_url_env(self) -> str | None:
        """The variable that moves this provider's home URL (``OPENAI_BASE_URL``, ...)."""
        if self.codec is None:
            return None
        return re.sub(r"[^A-Z0-9]", "_", self.name.upper()) + "_BASE_URL"

    @property
    def default_base_url(self) -> str | None:
        """Where requests go when no ``base_url`` is given: ``<NAME>_BASE_URL`` from the
        environment when set (the official SDKs read the same variables), else the codec's
        home URL."""
        if self.codec is None:
            return None
        return os.environ.get(self.base_url_env or "") or self.codec.default_base_url

    @property
    def speaks_dialects(self) -> bool:
        return self.codec is not None and self.codec.speaks_dialects

    @property
    def has_batch_api(self) -> bool:
        return self.batch_backend is not None


_PROVIDERS: dict[str, ProviderSpec] = {}


def register_provider(spec: ProviderSpec) -> ProviderSpec:
    """Make ``spec.name`` usable as a ``message_format`` (and batch provider); a later
    registration under the same name replaces the earlier one."""
    _PROVIDERS[spec.name] = spec
    return spec


def provider_names() -> tuple[str, ...]:
    return tuple(_PROVIDERS)


def batch_provider_names() -> tuple[str, ...]:
    return tuple(name for name, spec in _PROVIDERS.items() if spec.has_batch_api)


def cut_finish_reasons() -> frozenset[str]:
    """Every HTTP provider's words for "stopped by the token limit" (``Codec.cut_reasons``),
    for answers read back without their provider (mmirage's batch results store)."""
    reasons: set[str] = set()
    for spec in _PROVIDERS.values():
        if spec.codec is not None:
            reasons |= spec.codec.cut_reasons
    return frozenset(reasons)


def provider_spec(message_format: str) -> ProviderSpec:
    try:
        return _PROVIDERS[message_format]
    except KeyError:
        raise ConfigError(
            f"unknown message_format {message_format!r}; use one of: {', '.join(_PROVIDERS)}"
        ) from None


def get_codec(message_format: str) -> Codec:
    """A fresh codec of an HTTP provider."""
    codec = provider_spec(message_format).codec
    if codec is None:
        raise ConfigError(
            f"message_format {message_format!r} runs in this process and has no wire format"
        )
    return codec()


def key_from_env(message_format: str) -> str | None:
    for name in provider_spec(message_format).key_env:
        value = os.environ.get(name)
        if value:
            return value
    return None


def require_key(message_format: str) -> str:
    """The provider's key from the environment, or MissingAPIKeyError saying what to set."""
    key = key_from_env(message_format)
    if not key:
        names = provider_spec(message_format).key_env
        raise MissingAPIKeyError(
            f"no API key for {message_format}: set {' or '.join(names)} in the environment "
            f"(export {names[0]}=…)"
        )
    return key


__all__ = [
    "ProviderSpec",
    "batch_provider_names",
    "cut_finish_reasons",
    "get_codec",
    "key_from_env",
    "provider_names",
    "provider_spec",
    "register_provider",
    "require_key",
]
