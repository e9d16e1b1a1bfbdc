"""The columns mmirage adds to every published row, so that no data column may take their names.

A published row is flat: the source row's columns (unless ``remove_columns``), the
``output_schema`` columns, then mmirage's own (named here; ``mmirage.rundir``, which owns the
files a run writes, hands them on). A source or schema column called ``__errors__`` or
``__row_key__`` would be overwritten, and one called ``__vars__`` or ``__retry__`` would be read
by ``merge`` or ``retry`` as their bookkeeping: dropped or misread, silently. Renaming it
behind the user's back would change their schema, so such a column is refused, in one sentence
that says how to go on.
"""

from __future__ import annotations

ROW_KEY = "__row_key__"  # "<dataset index>:<split or ''>:<row id>", the same on every run
ERRORS = "__errors__"  # null, or {<output name>: <one sentence>}
USAGE = "__usage__"  # {"input_tokens", "output_tokens"} summed over the row's outputs
VARS = "__vars__"  # only on rows waiting for batch results: what output_schema reads
RETRY = "__retry__"  # only on rows a retry may fix: the outputs they already got
RESERVED_COLUMNS = frozenset({ROW_KEY, ERRORS, USAGE, VARS, RETRY})


def reserved_problem(column: str, where: str = "") -> str:
    """Why ``column`` (``where``: e.g. " of <file> (row id 3)") may not be a data column, and
    what to do instead."""
    names = ", ".join(sorted(RESERVED_COLUMNS))
    return (
        f"column '{column}'{where} has a name mmirage reserves for its own columns ({names}); "
        "rename it"
    )


__all__ = ["ERRORS", "RESERVED_COLUMNS", "RETRY", "ROW_KEY", "USAGE", "VARS", "reserved_problem"]
