"""A row's input variables: JMESPath lookups, images resolved to a path or a URL.

A row that cannot yield its variables raises ``RowError``: only that row fails, so one missing
field or image does not cost the shard's other rows.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol

from llm_kit.images import sniff_media_type
from mmirage.config.fields import is_field_path
from mmirage.core.render.image_files import local_image_path
from mmirage.core.render.row_error import RowError

if TYPE_CHECKING:
    from jmespath.parser import ParsedResult

    from mmirage.config.processing_params import ProcessingParams


class InputSpec(Protocol):
    """What extraction reads from ``config.processing.InputVar``."""

    @property
    def name(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def type(self) -> str: ...


class _FieldPath:
    """``a.b.c``: what JMESPath answers for a plain field path, a few times faster (most keys
    are plain column names, and this runs for every input of every row)."""

    def __init__(self, key: str) -> None:
        self.parts = tuple(key.split("."))

    def search(self, value: Any) -> Any:
        for part in self.parts:
            if type(value) is not dict and not isinstance(value, Mapping):  # dict: no ABC check
                return None
            value = value.get(part)
        return value


@lru_cache(maxsize=1024)
def compile_key(key: str) -> ParsedResult | _FieldPath:
    """One compiled expression per distinct key, shared by every row and every extractor."""
    if is_field_path(key):
        return _FieldPath(key)
    import jmespath  # only for keys that are more than a field path

    return jmespath.compile(key)


def _is_url(value: str) -> bool:
    return value.startswith(("http://", "https://", "data:"))


def resolve_image(
    value: Any,
    variable: str,
    image_base_path: str | None = None,
    *,
    allow_absolute: bool = False,
) -> str:
    """An image reference as a string ``Message.user(image_urls=...)`` accepts.

    http(s) and data URLs are kept; a local path or ``file://`` URL must name an image file
    inside ``image_base_path`` (else the working directory), or anywhere with
    ``allow_absolute`` for absolute ones, and becomes its real absolute path (see
    ``image_files``). HF ``Image`` cells (``{"bytes", "path"}``) and raw bytes become data
    URLs, as no file may exist for them.
    """
    if isinstance(value, Mapping) and ("bytes" in value or "path" in value):
        if value.get("bytes"):
            return _data_url(value["bytes"], str(value.get("path") or ""))
        value = value.get("path")
    if isinstance(value, bytes | bytearray):
        return _data_url(bytes(value), "")
    if not isinstance(value, str) or not value.strip():
        raise RowError(
            f"image variable '{variable}' must be a path or URL string, got "
            f"{type(value).__name__} {value!r:.80}; fix the column or its JMESPath key",
            variable=variable,
        )
    if _is_url(value):
        return value
    return local_image_path(value, variable, image_base_path, allow_absolute=allow_absolute)


def _data_url(data: bytes, name: str) -> str:
    return f"data:{sniff_media_type(data, name)};base64,{base64.b64encode(data).decode('ascii')}"


class VariableExtractor:
    """Extracts one dataset's input variables from its rows (built once, used per row).

    ``optional`` names inputs whose missing value becomes ``None`` instead of a ``RowError``;
    an ``optional`` attribute on an input (once the config has one) does the same.
    """

    def __init__(
        self,
        inputs: Iterable[InputSpec],
        *,
        image_base_path: str | None = None,
        optional: Collection[str] = (),
        allow_absolute_image_paths: bool = False,
    ) -> None:
        self.inputs: tuple[InputSpec, ...] = tuple(inputs)
        self.image_base_path = image_base_path
        self.allow_absolute_image_paths = allow_absolute_image_paths
        self._optional = frozenset(optional) | {
            i.name for i in self.inputs if getattr(i, "optional", False)
        }
        self._compiled = [(i, compile_key(i.key)) for i in self.inputs]
        # Every input a top-level column and none an image (the common case): (name, key)
        # pairs, read a column at a time.
        plain = all(
            isinstance(c, _FieldPath) and len(c.parts) == 1 and i.type != "image"
            for i, c in self._compiled
        )
        self._columns = tuple((i.name, i.key) for i in self.inputs) if plain else None

    @classmethod
    def for_params(cls, params: ProcessingParams, image_base_path: str | None) -> VariableExtractor:
        """The extractor of ``processing_params`` for one dataset (its ``image_base_path``)."""
        return cls(
            params.inputs,
            image_base_path=image_base_path,
            allow_absolute_image_paths=params.allow_absolute_image_paths,
        )

    def extract(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """``{name: value}`` in declared order; images as path or URL strings (or lists)."""
        variables: dict[str, Any] = {}
        for spec, expression in self._compiled:
            value = expression.search(row)
            if value is None:
                if spec.name not in self._optional:
                    raise RowError(
                        f"input variable '{spec.name}' with key '{spec.key}' is missing or null "
                        "in this row; fix the data or mark the input optional: true",
                        variable=spec.name,
                        key=spec.key,
                    )
            elif spec.type == "image":
                value = self._images(value, spec.name)
            variables[spec.name] = value
        return variables

    def extract_available(self, row: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """For a row ``extract`` refused: the variables it can still read, and the names of
        those it cannot (so that its record keeps whatever reads only the others)."""
        variables: dict[str, Any] = {}
        failed: list[str] = []
        for spec in self.inputs:
            try:
                variables.update(VariableExtractor((spec,), **self._options).extract(row))
            except RowError:
                failed.append(spec.name)
        return variables, failed

    @property
    def _options(self) -> dict[str, Any]:
        return {
            "image_base_path": self.image_base_path,
            "optional": self._optional,
            "allow_absolute_image_paths": self.allow_absolute_image_paths,
        }

    def extract_each(
        self, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[list[dict[str, Any] | None], dict[int, RowError]]:
        """``extract`` for many rows in one call (rows are many: one call per group, not per
        row). A row that cannot yield its variables is ``None`` in the list, its error under
        its index in the dict."""
        out: list[dict[str, Any] | None] = []
        errors: dict[int, RowError] = {}
        if self._columns is not None:
            try:
                # ``dict.get`` over the rows in C: no Python step per row (a row that is not
                # a plain dict raises TypeError, and goes row by row below).
                get: Any = dict.get  # typed loosely: rows are Mappings, and a dict is asked for
                columns = [list(map(get, rows, itertools.repeat(k))) for _, k in self._columns]
            except TypeError:
                pass
            else:
                names = [name for name, _ in self._columns]
                if len(names) == 1:
                    name = names[0]
                    out = [{name: value} for value in columns[0]]
                elif names:
                    each = zip(*columns, strict=True)
                    out = [dict(zip(names, values, strict=True)) for values in each]
                else:
                    out = [{} for _ in rows]
                try:
                    for name, column in zip(names, columns, strict=True):
                        # (``in`` compares with ==: a value like a numpy array raises.)
                        if name not in self._optional and None in column:
                            self._missing(rows, out, errors, column)
                except (TypeError, ValueError):
                    out, errors = [], {}  # row by row, below
                else:
                    return out, errors
        for index, row in enumerate(rows):
            try:
                out.append(self.extract(row))
            except RowError as exc:
                out.append(None)
                errors[index] = exc
        return out, errors

    def _missing(
        self,
        rows: Sequence[Mapping[str, Any]],
        out: list[dict[str, Any] | None],
        errors: dict[int, RowError],
        column: list[Any],
    ) -> None:
        """The rows lacking a required value of ``column``: ``None`` in ``out``, and why."""
        for index, value in enumerate(column):
            if value is None and index not in errors:
                try:
                    self.extract(rows[index])  # raises: its sentence names the input
                except RowError as exc:
                    errors[index] = exc
                    out[index] = None

    def _images(self, value: Any, name: str) -> str | list[str]:
        # A list of images stays a list (one row, several images); a bytes/HF cell is one image.
        if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
            return [self._image(v, name) for v in value]
        return self._image(value, name)

    def _image(self, value: Any, name: str) -> str:
        return resolve_image(
            value, name, self.image_base_path, allow_absolute=self.allow_absolute_image_paths
        )


def extract_variables(
    row: Mapping[str, Any],
    inputs: Iterable[InputSpec],
    *,
    image_base_path: str | None = None,
    optional: Collection[str] = (),
) -> dict[str, Any]:
    """One-shot form of ``VariableExtractor(...).extract(row)`` (keys are still compiled once)."""
    return VariableExtractor(inputs, image_base_path=image_base_path, optional=optional).extract(
        row
    )


def image_urls(variables: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """The row's images, flattened in the given variable order, skipping optional ``None``s."""
    urls: list[str] = []
    for name in names:
        value = variables.get(name)
        if isinstance(value, str):
            urls.append(value)
        elif isinstance(value, list):
            urls.extend(value)
    return urls
