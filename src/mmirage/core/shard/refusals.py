"""Rows refused before any output runs for them.

A row whose variables cannot all be read (a missing field, an image path the checks or the OS
refuse) is that row's error: its record keeps the source columns and every schema field that
reads only its readable inputs; only what reads an output (none ran) or an unreadable
variable is ``None``. A source column named as one of mmirage's own columns is the data's
error: the whole run stops at it, in one sentence (see ``mmirage.config.reserved``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmirage.config.reserved import RESERVED_COLUMNS, reserved_problem
from mmirage.core.loader import DataError, DatasetSource, Row
from mmirage.core.render.renderer import OutputRenderer
from mmirage.core.render.variables import VariableExtractor
from mmirage.rundir import ERRORS, ROW_KEY, USAGE


def refused_record(
    key: str,
    row: Mapping[str, Any],
    why: str,
    extractor: VariableExtractor,
    renderer: OutputRenderer,
    outputs: Sequence[str],
) -> dict[str, Any]:
    """The published record of ``row`` (row key ``key``), refused for ``why``."""
    variables, failed = extractor.extract_available(row)
    record, schema_error = renderer.render_partial(variables, row, [*failed, *outputs])
    errors = {"__row__": why}
    if schema_error is not None:
        errors["__schema__"] = schema_error
    usage = {"input_tokens": 0, "output_tokens": 0}
    return {**record, ROW_KEY: key, ERRORS: errors, USAGE: usage}


def reserved_column_error(rows: Sequence[Row], source: DatasetSource) -> DataError:
    """The refusal of the first of ``rows`` with a column named as one of mmirage's."""
    row = next(r for r in rows if not RESERVED_COLUMNS.isdisjoint(r.data))
    column = min(RESERVED_COLUMNS.intersection(row.data))
    path = source.config.path
    file = path.get(row.split or "", "") if isinstance(path, Mapping) else path
    problem = reserved_problem(column, f" of {file} (row id {row.row_id})")
    return DataError(
        f"{problem} in the data, or set processing_params.remove_columns: true to publish "
        "only the output_schema columns"
    )
