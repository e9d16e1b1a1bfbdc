"""MkDocs hook: the build fails when a public name of ``llm_kit`` has no docstring of its
own, since the Python API reference is rendered from them."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from mkdocs.exceptions import PluginError

import llm_kit


def undocumented_api() -> Iterator[str]:
    """``llm_kit.X`` for each public name without a docstring of its own."""
    for name in llm_kit.__all__:
        obj = getattr(llm_kit, name)
        own = vars(obj).get("__doc__") if isinstance(obj, type) else inspect.getdoc(obj)
        if not (own or "").strip():
            yield f"llm_kit.{name}"


def on_config(config: Any, **_: Any) -> Any:
    missing = list(undocumented_api())
    if missing:
        raise PluginError(f"Python API reference: no docstring for {', '.join(missing)}")
    return config
