"""Modules a user names so that the plain CLI knows their batch providers and processor types.

A plugin module registers what it defines when it is imported. The loader imports, once per
process, every module named by an entry-point group, then those a comma-separated environment
variable names (they may override the installed ones). Processor plugins are loaded before a
config is read when the variable names any, else once a config names a type that is not built
in; provider plugins when a config needs a provider (``config.reader``).

* batch providers: ``mmirage.batch_providers`` / ``MMIRAGE_BATCH_PROVIDERS``;
* processor types: ``mmirage.processors`` / ``MMIRAGE_PROCESSORS``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from importlib.metadata import entry_points


@dataclass
class PluginLoader:
    """Imports the plugin modules of one kind, once; ``reset`` lets a test load them again."""

    kind: str  # "batch provider", "processor": how errors name the plugin
    group: str  # entry-point group
    env: str  # environment variable holding module names
    loaded: bool = field(default=False)

    def load(self) -> None:
        """Import every plugin module (once). One that fails to import is an ``ImportError``
        naming it."""
        if self.loaded:
            return
        self.loaded = True
        for ep in entry_points(group=self.group):
            try:
                loaded = ep.load()
            except Exception as exc:
                raise ImportError(
                    f"the {self.kind} plugin '{ep.name}' ({ep.value}) failed to load: {exc}"
                ) from exc
            if callable(loaded) and not isinstance(loaded, type):
                loaded()  # an entry point may name a register() function instead of a module
        for module in filter(None, (m.strip() for m in os.environ.get(self.env, "").split(","))):
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise ImportError(
                    f"{self.env} names the module '{module}', which failed to import: {exc}; "
                    "check that it is on PYTHONPATH"
                ) from exc

    def load_if_named(self) -> None:
        """``load``, when the environment variable names modules: they are imported before a
        config is read, after the installed plugins, which they may override. Else nothing
        yet: reading every installed package's entry points costs a run ~10 ms, so a config
        reads them only for a type it does not know (and a broken installed plugin fails only
        the configs that need one)."""
        if os.environ.get(self.env, "").strip(" ,"):
            self.load()

    def reset(self) -> None:
        self.loaded = False


PROVIDER_PLUGINS = PluginLoader(
    "batch provider", "mmirage.batch_providers", "MMIRAGE_BATCH_PROVIDERS"
)
PROCESSOR_PLUGINS = PluginLoader("processor", "mmirage.processors", "MMIRAGE_PROCESSORS")


def load_provider_plugins() -> None:
    PROVIDER_PLUGINS.load()


def load_processor_plugins(*, installed: bool = True) -> None:
    """The processor plugins; ``installed=False``: only if ``MMIRAGE_PROCESSORS`` names any
    (``PluginLoader.load_if_named``)."""
    if installed:
        PROCESSOR_PLUGINS.load()
    else:
        PROCESSOR_PLUGINS.load_if_named()


__all__ = [
    "PROCESSOR_PLUGINS",
    "PROVIDER_PLUGINS",
    "PluginLoader",
    "load_processor_plugins",
    "load_provider_plugins",
]
