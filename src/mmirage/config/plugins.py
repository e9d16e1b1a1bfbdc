"""Modules a user names so that the plain CLI knows their batch providers and processor types.

A plugin module registers what it defines when it is imported. The loader imports, once per
process, every module named by an entry-point group or by a comma-separated environment
variable (the variable's before a config is read, the entry points' once a config names a type
or provider that is not built in):

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

    named: bool = field(default=False)  # the environment variable's modules are imported

    def load(self) -> None:
        """Import every plugin module (once). One that fails to import is an ``ImportError``
        naming it."""
        self.load_named()
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

    def load_named(self) -> None:
        """Import the modules the environment variable names (once), not the entry points:
        reading every installed package's entry points costs a run ~10 ms, so a config
        reads them only for a type it does not know."""
        if self.named:
            return
        self.named = True
        for module in filter(None, (m.strip() for m in os.environ.get(self.env, "").split(","))):
            try:
                importlib.import_module(module)
            except Exception as exc:
                raise ImportError(
                    f"{self.env} names the module '{module}', which failed to import: {exc}; "
                    "check that it is on PYTHONPATH"
                ) from exc

    def reset(self) -> None:
        self.loaded = self.named = False


PROVIDER_PLUGINS = PluginLoader(
    "batch provider", "mmirage.batch_providers", "MMIRAGE_BATCH_PROVIDERS"
)
PROCESSOR_PLUGINS = PluginLoader("processor", "mmirage.processors", "MMIRAGE_PROCESSORS")


def load_provider_plugins() -> None:
    PROVIDER_PLUGINS.load()


def load_processor_plugins(*, installed: bool = True) -> None:
    """The processor plugins; ``installed=False``: only those ``MMIRAGE_PROCESSORS`` names."""
    if installed:
        PROCESSOR_PLUGINS.load()
    else:
        PROCESSOR_PLUGINS.load_named()


__all__ = [
    "PROCESSOR_PLUGINS",
    "PROVIDER_PLUGINS",
    "PluginLoader",
    "load_processor_plugins",
    "load_provider_plugins",
]
