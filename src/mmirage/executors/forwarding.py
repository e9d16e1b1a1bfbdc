"""What a shard process needs from the process that starts it besides its arguments: the
custom batch providers its config uses, registered in this process
(``plugins.forwarded_providers``)."""

from __future__ import annotations

from mmirage.config.models import MMirageConfig
from mmirage.config.plugins import forwarded_providers
from mmirage.config.processors import BatchApiProcessorConfig
from mmirage.config.provider_resolution import BatchProviderConfigRegistry


def shard_env(cfg: MMirageConfig) -> dict[str, str]:
    """Environment variables for a shard process of ``cfg`` that this one starts (``{}`` when
    it uses no custom config or adapter registered here); a ``UserError`` for one whose
    classes that process cannot import."""
    used = {
        p.provider_config.provider for p in cfg.processors if isinstance(p, BatchApiProcessorConfig)
    }
    if not used:  # the adapters' registry (and llm_kit) need not even be imported
        return {}
    from mmirage.core.process.batch.registry import BatchAdapterRegistry

    registered: dict[str, dict[str, type]] = {}
    for kind, custom in (
        ("config", BatchProviderConfigRegistry.custom()),
        ("adapter", BatchAdapterRegistry.custom()),
    ):
        for key, cls in custom.items():
            if key in used:
                registered.setdefault(key, {})[kind] = cls
    return forwarded_providers(registered)


__all__ = ["shard_env"]
