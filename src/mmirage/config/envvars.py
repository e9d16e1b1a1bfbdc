"""``${VAR}``, ``${VAR:-default}`` and ``$VAR`` in configuration values — never in templates.

Prompts, output schemas and other Jinja text are data, not configuration: a ``$HOME`` in a
prompt must reach the model as written, not silently rewritten. ``$$`` is a literal
``$``. An unset variable without a default is an error, except in ``loading_params.shard_id``,
where it means "no shard fixed here: the one the CLI or executor chooses" (``None``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from mmirage.config.errors import ConfigError
from mmirage.errors import MmirageError

_REFERENCE = re.compile(
    r"\$\$"  # escaped dollar
    r"|\$\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<bad>\$\{[^}]*\}?)"
)

# Fields whose text is a template or a value for the dataset, kept verbatim.
_OUTPUT_TEXT_FIELDS = frozenset(
    {"prompt", "system_prompt", "negative_prompt", "filename_template", "output_schema"}
)

# An unresolved variable here means "not fixed by the config".
_OPTIONAL_WHEN_UNSET = (("loading_params", "shard_id"),)


class _Unset(MmirageError):
    def __init__(self, name: str) -> None:
        self.name = name


def format_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def is_verbatim(path: tuple[str | int, ...]) -> bool:
    """True for values that env expansion must not touch."""
    if path[:2] == ("processing_params", "output_schema"):
        return True
    if len(path) >= 4 and path[:2] == ("processing_params", "outputs"):
        return path[3] in _OUTPUT_TEXT_FIELDS
    return len(path) >= 3 and path[0] == "processors" and path[2] == "fallback_value"


def expand_string(text: str, env: Mapping[str, str]) -> str:
    """Expand one string; raises ``_Unset`` for an unset variable without a default."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        if match.group("bad") is not None:
            raise ValueError(f"malformed variable reference {match.group('bad')!r}")
        name = match.group("braced") or match.group("bare")
        value = env.get(name)
        if value:
            return value
        default = match.group("default")
        if default is not None:  # shell semantics: the default also covers an empty value
            return default
        if value is not None:
            return value
        raise _Unset(name)

    return _REFERENCE.sub(replace, text)


def expand_tree(data: Any, env: Mapping[str, str], source: str) -> Any:
    """A copy of the parsed YAML with every configuration string expanded."""
    return _walk(data, (), env, source)


def _walk(node: Any, path: tuple[str | int, ...], env: Mapping[str, str], source: str) -> Any:
    if path and is_verbatim(path):
        return node
    if isinstance(node, dict):
        return {key: _walk(value, (*path, str(key)), env, source) for key, value in node.items()}
    if isinstance(node, list):
        return [_walk(value, (*path, index), env, source) for index, value in enumerate(node)]
    if not isinstance(node, str) or "$" not in node:
        return node
    try:
        return expand_string(node, env)
    except _Unset as unset:
        if path in _OPTIONAL_WHEN_UNSET:
            return None
        raise ConfigError(
            source,
            format_path(path),
            f"environment variable '{unset.name}' is not set; export it or write "
            f"${{{unset.name}:-default}}",
        ) from None
    except ValueError as exc:
        raise ConfigError(source, format_path(path), f"{exc}; write $$ for a literal $") from None
