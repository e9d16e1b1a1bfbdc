"""Counting published rows (``tally_rows``): the counters a checkpoint keeps, from the rows as
written, whatever a row holds or lacks."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

import pytest

from mmirage.core.shard.tally import tally, tally_rows
from mmirage.rundir import ERRORS, RETRY, USAGE

ROWS: list[dict[str, Any]] = [
    {ERRORS: None, USAGE: {"input_tokens": 3, "output_tokens": 4}},
    {ERRORS: {"a": "refused"}, USAGE: {"input_tokens": 1.0, "output_tokens": None}, RETRY: {}},
    {ERRORS: {}, USAGE: None},  # an empty error mapping is no failure
    {},  # a row read back without the columns
    {USAGE: {"input_tokens": "5", "output_tokens": 0}},  # text a person wrote in
]


def _counters() -> SimpleNamespace:
    return SimpleNamespace(
        rows_done=0, rows_failed=0, rows_retryable=0, input_tokens=0, output_tokens=0
    )


@pytest.mark.parametrize("kind", [dict, OrderedDict], ids=["dict", "other mapping"])
def test_rows_are_counted_whatever_they_hold(kind: Any) -> None:
    counters = _counters()
    tally_rows(counters, [kind(row) for row in ROWS])
    assert vars(counters) == {
        "rows_done": 5,
        "rows_failed": 1,
        "rows_retryable": 1,
        "input_tokens": 9,
        "output_tokens": 4,
    }
    assert isinstance(counters.input_tokens, int)


def test_a_row_at_a_time_counts_as_the_rows_together() -> None:
    one_by_one, together = _counters(), _counters()
    for row in ROWS:
        tally(one_by_one, row)
    tally_rows(together, iter(ROWS))
    assert vars(one_by_one) == vars(together)
