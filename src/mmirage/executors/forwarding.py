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
    it uses no custom provider registered here); a ``UserError`` for one whose classes that
    process cannot import."""
    used = {
        p.provider_config.provider for p in cfg.processors if isinstance(p, BatchApiProcessorConfig)
    }
    configs = {k: c for k, c in BatchProviderConfigRegistry.custom().items() if k in used}
    if not configs:  # the adapters' registry (and llm_kit) need not even be imported
        return {}
    from mmirage.core.process.batch.registry import BatchAdapterRegistry

    registered: dict[str, dict[str, type]] = {k: {"config": c} for k, c in configs.items()}
    for key, adapter_cls in BatchAdapterRegistry.custom().items():
        if key in registered:
            registered[key]["adapter"] = adapter_cls
    return forwarded_providers(registered)


__all__ = ["shard_env"]
