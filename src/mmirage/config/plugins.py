"""Modules a user names so that the plain CLI knows their batch providers and processor types.

A plugin module registers what it defines when it is imported. The loader imports, once per
process, every module named by an entry-point group, then those a comma-separated environment
variable names (they may override the installed ones). Processor plugins are loaded before a
config is read when the variable names any, else once a config names a type that is not built
in; provider plugins when a config needs a provider (``config.reader``).

* batch providers: ``mmirage.batch_providers`` / ``MMIRAGE_BATCH_PROVIDERS``;
* processor types: ``mmirage.processors`` / ``MMIRAGE_PROCESSORS``.

A batch provider registered in-process (``register``, in an application's bootstrap) is
carried to the shard processes that process starts (local parallel shards, SLURM tasks, each a
``python -m mmirage``): ``forwarded_providers`` names its classes in ``FORWARDED_ENV``, and each
registry of a shard process imports them from there on a lookup that finds nothing.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

from mmirage.errors import UserError

FORWARDED_ENV = "MMIRAGE_FORWARDED_BATCH_PROVIDERS"  # {name: {"config"|"adapter": "mod:Qual"}}


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


def forwarded_providers(registered: Mapping[str, Mapping[str, type]]) -> dict[str, str]:
    """The environment that carries ``registered`` ({provider: {"config"|"adapter": class}},
    the custom ones of this process) to a shard process; ``{}`` when there are none. The
    folders their modules were imported from travel too (a shard process starts elsewhere, or
    without the bootstrap script's folder on its path). A class a new process cannot import
    (defined in a script run as ``__main__``, or in a function) is a ``UserError`` naming it."""
    if not registered:
        return {}
    providers: dict[str, dict[str, str]] = {}
    roots: list[str] = []
    for name, classes in registered.items():
        for kind, cls in classes.items():
            if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
                raise UserError(
                    f"batch provider '{name}' is registered with {cls.__qualname__}, defined "
                    f"in {'a function' if '<locals>' in cls.__qualname__ else 'the script run'}"
                    ", which the shard processes this run starts cannot import: define its "
                    "classes in a module (they are registered from there in each process)"
                )
            providers.setdefault(name, {})[kind] = f"{cls.__module__}:{cls.__qualname__}"
            root = _import_root(cls.__module__)
            if root is not None and root not in roots:
                roots.append(root)
    return {FORWARDED_ENV: json.dumps({"providers": providers, "paths": roots}, sort_keys=True)}


def _import_root(module: str) -> str | None:
    """The folder on ``sys.path`` that ``module``'s top-level package was imported from."""
    top = sys.modules.get(module.partition(".")[0])
    where = getattr(top, "__file__", None)
    if not where:
        return None
    path = Path(where).resolve()
    return str(path.parent.parent if path.name == "__init__.py" else path.parent)


def forwarded_class(name: str, kind: str) -> type | None:
    """The ``kind`` ("config" or "adapter") class of provider ``name`` that the process which
    started this one registered (``forwarded_providers``), imported; ``None``: none was. One
    that cannot be imported here is a ``UserError`` naming it."""
    try:
        forwarded = json.loads(os.environ.get(FORWARDED_ENV) or "{}")
        path = forwarded["providers"][name][kind]
    except (ValueError, KeyError, TypeError):
        return None
    for root in forwarded.get("paths") or ():
        if root not in sys.path:
            sys.path.append(root)
    module, _, qualname = path.partition(":")
    try:
        found: object = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise UserError(
            f"batch provider '{name}' was registered by the process that started this shard "
            f"with {path} ({FORWARDED_ENV}), which cannot be imported here ({exc}); install "
            "its module where the shards run, or put its folder on PYTHONPATH"
        ) from None
    return found if isinstance(found, type) else None


__all__ = [
    "FORWARDED_ENV",
    "PROCESSOR_PLUGINS",
    "PROVIDER_PLUGINS",
    "PluginLoader",
    "forwarded_class",
    "forwarded_providers",
    "load_processor_plugins",
    "load_provider_plugins",
]
