"""The Arrow schema of rows, inferred batch by batch ("permissive": ``null`` becomes any type,
``int`` widens to ``float``, struct fields are merged; a column whose values cannot share one
type is written as JSON text). Incremental, so that a writer can tell whether a batch changed
what the batches before it agreed on (``formats`` writes in one pass while none does)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mmirage.core.writer.arrow_columns import plain_type


@dataclass
class Schema:
    """The Arrow schema of the written rows and the columns written as JSON text."""

    arrow: Any  # pyarrow.Schema
    json_columns: list[str] = field(default_factory=list)


class SchemaInference:
    """The schema of the batches ``add``-ed so far; column order is first-seen order."""

    def __init__(self) -> None:
        self.types: dict[str, Any] = {}  # pyarrow types
        self.as_json: set[str] = set()

    def add(self, batch: list[dict[str, Any]]) -> bool:
        """Take one batch into the schema; whether that changed the schema."""
        import pyarrow as pa

        before = (dict(self.types), set(self.as_json))
        types, as_json = self.types, self.as_json
        names: dict[str, None] = {}
        for row in batch:
            names.update(dict.fromkeys(row))
        for name in names:
            if name in as_json:
                continue
            values = [row.get(name) for row in batch]
            try:
                seen = plain_type(values)
                seen = pa.array(values).type if seen is None else seen
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                as_json.add(name)  # mixed types inside this batch already
                types.setdefault(name, pa.string())
                continue
            if name not in types:
                types[name] = seen
                continue
            try:
                merged = pa.unify_schemas(
                    [pa.schema([(name, types[name])]), pa.schema([(name, seen)])],
                    promote_options="permissive",
                )
            except (pa.ArrowInvalid, pa.ArrowTypeError, NotImplementedError):
                as_json.add(name)
                types[name] = pa.string()
            else:
                types[name] = merged.field(name).type
        for name in as_json:
            types[name] = pa.string()
        return (types, as_json) != before

    def schema(self) -> Schema:
        import pyarrow as pa

        return Schema(pa.schema(list(self.types.items())), sorted(self.as_json))


def infer_schema(batches: Iterable[list[dict[str, Any]]]) -> Schema:
    """One pass over the rows."""
    inference = SchemaInference()
    for batch in batches:
        inference.add(batch)
    return inference.schema()


__all__ = ["Schema", "SchemaInference", "infer_schema"]
