"""MkDocs hook: the build fails when a CLI command or option, or a public name of llm_kit, has
no description, since the CLI and Python API references are generated from them."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import click
from mkdocs.exceptions import PluginError

import llm_kit
from mmirage.cli import main


def undocumented_cli(command: click.Command, path: str = "mmirage") -> Iterator[str]:
    """``mmirage run --flag`` for each command without help and option without ``help=``."""
    if not (command.help or "").strip():
        yield path
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip():
            yield f"{path} {param.opts[-1]}"
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            if not sub.hidden:
                yield from undocumented_cli(sub, f"{path} {name}")


def undocumented_api() -> Iterator[str]:
    """``llm_kit.X`` for each public name without a docstring of its own."""
    for name in llm_kit.__all__:
        obj = getattr(llm_kit, name)
        own = vars(obj).get("__doc__") if isinstance(obj, type) else inspect.getdoc(obj)
        if not (own or "").strip():
            yield f"llm_kit.{name}"


def on_config(config: Any, **_: Any) -> Any:
    missing = [*undocumented_cli(main), *undocumented_api()]
    if missing:
        raise PluginError(f"no description for: {', '.join(missing)}")
    return config
