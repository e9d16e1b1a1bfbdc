"""What every processor needs from the environment, checked before the run creates anything:
a run refused for a missing key leaves no empty output or state folders behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mmirage.config.models import MMirageConfig


def _llm_key(config: Any) -> None:
    from llm_kit.client import require_key
    from mmirage.core.process.llm_processor import check_named_key, resolve_message_format
    from mmirage.core.process.server_launcher import wants_server

    message_format = resolve_message_format(config)
    check_named_key(config)
    # A base_url (or a server launched for the shard) may need no key: LLM decides then.
    named = config.api_key_env is not None  # checked above, instead of the provider's
    if message_format != "local" and not (config.base_url or named or wants_server(config)):
        require_key(message_format)


def _batch_credentials(config: Any) -> None:
    from mmirage.core.process.batch.registry import BatchAdapterRegistry

    BatchAdapterRegistry.resolve(config.provider).read_credentials(config.provider)


# By processor type; a type without an entry needs nothing from the environment.
_CHECKS: dict[str, Callable[[Any], None]] = {"llm": _llm_key, "batch_api": _batch_credentials}


def check_credentials(cfg: MMirageConfig) -> None:
    """Raise the processor's own missing-key error (a user error: exit 2) before any work."""
    for processor in cfg.processors:
        check = _CHECKS.get(processor.type)
        if check is not None:
            check(processor)
