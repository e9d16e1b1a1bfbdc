"""Raw YAML mapping → one typed dataclass, with errors as ``ConfigError`` sentences.

Unknown keys are found here, by walking the dataclass fields, so the message can name the
allowed keys (pydantic's own message only says "unexpected"); types and value rules are pydantic's
and the classes' ``__post_init__`` checks.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from mmirage.config.credentials import secret_key_problem
from mmirage.config.envvars import format_path
from mmirage.config.errors import ConfigError, FieldError

T = TypeVar("T")
Path = tuple[str | int, ...]


def public_fields(cls: type[Any]) -> list[str]:
    """Keys a user may write for ``cls``."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.init and not f.metadata.get("internal") and not f.name.startswith("_")
    ]


def check_keys(
    raw: Any, cls: type[Any], path: Path, source: str, extra: tuple[str, ...] = ()
) -> None:
    """Refuse keys ``cls`` does not declare, recursing into nested dataclass fields."""
    if not isinstance(raw, dict):
        return  # pydantic reports the wrong type with the right path
    allowed = [*extra, *public_fields(cls)]
    for key in raw:
        if key not in allowed:
            problem = secret_key_problem(str(key), raw) or unknown_key_problem(str(key), allowed)
            raise ConfigError(source, format_path((*path, str(key))), problem)
    hints = typing.get_type_hints(cls, include_extras=False)
    for key, value in raw.items():
        nested = _dataclass_in(hints.get(str(key)))
        if nested is None:
            continue
        if isinstance(value, dict):
            check_keys(value, nested, (*path, str(key)), source)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                check_keys(item, nested, (*path, str(key), index), source)


def unknown_key_problem(key: str, allowed: list[str]) -> str:
    import difflib  # only to word an error

    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown key '{key}'{hint}; allowed keys: {', '.join(allowed)}"


def _dataclass_in(hint: Any) -> type[Any] | None:
    """The dataclass inside ``X``, ``X | None`` or ``list[X]``, if any."""
    if hint is None:
        return None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return hint
    origin = typing.get_origin(hint)
    if origin in (list, typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            found = _dataclass_in(arg)
            if found is not None:
                return found
    return None


_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> TypeAdapter[Any]:
    # Building an adapter compiles a validator: do it once per class.
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def build(cls: type[T], raw: Any, path: Path, source: str, extra: tuple[str, ...] = ()) -> T:
    """Validate ``raw`` into ``cls``; the first problem becomes a ``ConfigError``."""
    if not isinstance(raw, dict):
        raise ConfigError(
            source, format_path(path), f"must be a mapping, got {describe_value(raw)}"
        )
    check_keys(raw, cls, path, source, extra)
    try:
        result: T = _adapter(cls).validate_python(raw)
    except ValidationError as exc:
        raise from_pydantic(exc, path, source) from None
    except FieldError as exc:  # raised outside pydantic's wrapping (defaults built eagerly)
        raise ConfigError(source, _join(format_path(path), exc.field), str(exc)) from None
    return result


def from_pydantic(exc: ValidationError, path: Path, source: str) -> ConfigError:
    error = exc.errors()[0]
    loc: Path = (*path, *(part for part in error["loc"] if not _is_union_tag(part)))
    where = format_path(loc)
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        return ConfigError(source, _join(where, cause.field), str(cause))
    return ConfigError(source, where, _problem(error))


def _join(where: str, field: str) -> str:
    if not field:
        return where
    if not where or field.startswith("["):
        return where + field
    return f"{where}.{field}"


def _is_union_tag(part: str | int) -> bool:
    # pydantic names union members in the location ("str", "function-after[...]", "dict[...]").
    return isinstance(part, str) and (
        "[" in part or part in ("str", "int", "float", "bool", "none", "dict", "list")
    )


def _problem(error: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "is required"
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        return "is not a known key"
    if kind == "value_error":
        return str(error["msg"]).removeprefix("Value error, ")
    message = str(error["msg"])
    message = (
        "must be " + message.removeprefix("Input should be ")
        if message.startswith("Input should be ")
        else message
    )
    return f"{message}, got {describe_value(error.get('input'))}"


def describe_value(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
