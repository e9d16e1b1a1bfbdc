"""Field types shared by the config sections."""

from __future__ import annotations

import os
import re
from typing import Annotated

from pydantic import AfterValidator, Field


def _expand_user(value: str) -> str:
    return os.path.expanduser(value)


def _optional_path(value: str | None) -> str | None:
    return os.path.expanduser(value) if value else None


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


PathStr = Annotated[str, AfterValidator(_expand_user)]
"""A filesystem path; ``~`` is expanded, relative paths stay relative to the working directory."""

OptionalPathStr = Annotated[str | None, AfterValidator(_optional_path)]
"""An optional path; ``""`` means unset (the samples write ``edf_env: ""``); ``~`` expanded."""

NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]
PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]


_FIELD_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_field_path(key: str) -> bool:
    """``a.b.c`` of plain names: what most ``inputs[].key`` are, and a valid JMESPath
    expression that needs no JMESPath to read (nor to check)."""
    return _FIELD_PATH.match(key) is not None
