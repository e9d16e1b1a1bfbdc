"""Rebuilding one published row from its ``__vars__`` and its requests' outcomes.

A row waiting for batch results keeps in ``__vars__`` the variables its ``output_schema``
reads. Only the variables named after a ``batch_api`` output whose value is that output's own
placeholder (``__BATCH_SUBMITTED__:<output>-<modality>-<n>``, the id the batch processor gives
it) are filled: the same text in a dataset column or in a live model's answer is data, and
filling it would hand the row another row's result (and count its tokens twice).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llm_kit.errors import ResponseValidationError
from llm_kit.schema import parse_response
from mmirage.core.process.batch.cost import PriceBook
from mmirage.core.process.batch.payload import custom_id_for
from mmirage.core.process.batch.receipts import MODALITIES
from mmirage.core.process.batch.results_store import SUCCEEDED, RequestOutcome
from mmirage.core.render.renderer import (
    bare_name,
    find_placeholders,
    is_placeholder,
    render_failed_columns,
    render_value,
)
from mmirage.core.render.variables import RowError
from mmirage.rundir import ERRORS, PLACEHOLDER_PREFIX, USAGE, VARS

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig

INVALID = "invalid"  # a result that came back but is not valid JSON for its schema
_PREFIX_LEN = len(PLACEHOLDER_PREFIX)
_ABSENT = object()


@dataclass
class MergeTotals:
    """What a merge wrote: rows, per-request outcomes, tokens (per model, for the cost)."""

    rows: int = 0
    rows_with_errors: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    input_tokens: int = 0
    output_tokens: int = 0
    usage_reported: bool = False
    tokens_by_model: dict[str, list[int]] = field(default_factory=dict)
    prices: PriceBook = field(default_factory=PriceBook)  # the run's, to price the tokens

    def add_usage(self, model: str | None, outcome: RequestOutcome) -> bool:
        if outcome.input_tokens is None and outcome.output_tokens is None:
            return False
        tin, tout = outcome.input_tokens or 0, outcome.output_tokens or 0
        self.usage_reported = True
        self.input_tokens += tin
        self.output_tokens += tout
        per_model = self.tokens_by_model.setdefault(model or "", [0, 0])
        per_model[0] += tin
        per_model[1] += tout
        return True


class RowBuilder:
    """Rebuilds one published row, in place, from its ``__vars__`` and its requests' outcomes.

    Only the schema columns that still hold a placeholder are rendered again: the others read
    no pending variable, so the run already rendered them from the same values (rendering is a
    pure function). That keeps a merged row equal to a live run's at a fraction of the cost.
    """

    def __init__(self, config: MMirageConfig) -> None:
        pp = config.processing_params
        self.schema = pp.output_schema
        # (column, template, where, the variable a bare ``{{ name }}`` column copies) once:
        # the per-row loop builds no names, and copies such a column without a render call.
        self._columns = [
            (key, tree, f"output_schema.{key}", bare_name(tree))
            for key, tree in self.schema.items()
        ]
        self._json_models: dict[str, Any] = {}
        self._models: dict[str, str | None] = {}  # output name → provider model (cost)
        # output name → (the provider config's token limit, its field): a cut answer names it.
        self._limits: dict[str, tuple[int | None, str]] = {}
        for output in pp.outputs:
            if output.type != "batch_api":
                continue
            if getattr(output, "is_json", False):
                name = "".join(part.capitalize() for part in output.name.split("_"))
                self._json_models[output.name] = output.schema.pydantic_model(name or "Output")
            provider_config = getattr(config.processor_for(output), "provider_config", None)
            self._models[output.name] = getattr(provider_config, "model", None)
            self._limits[output.name] = _token_limit(provider_config)

    def pending(self, row: Mapping[str, Any]) -> list[tuple[str, str]]:
        """``(variable, custom_id)`` of each placeholder the row's own batch requests left in
        its ``__vars__`` (see the module docstring: any other look-alike value is data)."""
        variables = row.get(VARS)
        if type(variables) is not dict:
            return []
        found = []
        for name, value in variables.items():
            if name in self._models and type(value) is str and value.startswith(PLACEHOLDER_PREFIX):
                custom_id = value[_PREFIX_LEN:]
                if is_own_request(name, custom_id):
                    found.append((name, custom_id))
        return found

    def rebuild(
        self,
        row: dict[str, Any],
        pending: Sequence[tuple[str, str]],
        outcomes: Mapping[str, RequestOutcome],
        totals: MergeTotals,
    ) -> dict[str, Any]:
        """``row`` rebuilt in place; ``pending`` is ``self.pending(row)``."""
        totals.rows += 1
        variables = row.pop(VARS, None)
        errors = _errors(row) if row.get(ERRORS) else {}  # most rows have none: no call
        if type(variables) is not dict:  # complete at run time, or failed then
            row[ERRORS] = errors or None
            totals.rows_with_errors += bool(errors)
            self._add_usage(row, None)
            return row
        spent = variables.pop(USAGE, None)  # what its live outputs spent (``row_usage``)
        if spent is not None:
            row[USAGE] = {"input_tokens": spent[0], "output_tokens": spent[1]}
        filled = dict(variables)
        tokens: list[int] | None = None
        requests = totals.requests
        for name, cid in pending:
            outcome = outcomes[cid]
            if totals.add_usage(self._models.get(name), outcome):
                tokens = tokens or [0, 0]
                tokens[0] += outcome.input_tokens or 0
                tokens[1] += outcome.output_tokens or 0
            state, usable = self._value(name, outcome)
            requests[state] += 1
            if state == SUCCEEDED:
                filled[name] = usable
            else:
                errors[name] = usable
        unavailable = (
            [n for n in errors if n not in filled or is_placeholder(filled[n])] if errors else []
        )
        if not unavailable:  # nothing failed without a fallback
            self._render(row, filled, errors)
        elif (problem := render_failed_columns(self.schema, row, filled, unavailable)) is not None:
            errors.setdefault("__schema__", problem)
        row[ERRORS] = errors or None
        self._add_usage(row, tokens)
        totals.rows_with_errors += bool(errors)
        return row

    def _value(self, name: str, outcome: RequestOutcome) -> tuple[str, Any]:
        """(state, value) for a usable result, else (state, the reason for ``__errors__``)."""
        if outcome.state != SUCCEEDED:  # ``not outcome.ok``, without the property call
            return outcome.state, outcome.reason()
        model = self._json_models.get(name)
        text = outcome.text or ""
        if model is None:
            return SUCCEEDED, text.strip()  # plain outputs: stripped, like a live run
        try:
            return SUCCEEDED, parse_response(text, model).model_dump(by_alias=True)
        except ResponseValidationError as exc:
            return INVALID, outcome.invalid_reason(str(exc), *self._limits[name])

    def _render(
        self, row: dict[str, Any], variables: Mapping[str, Any], errors: dict[str, str]
    ) -> None:
        """Render again the schema columns that hold a placeholder; a template that fails on
        the real values is a ``__schema__`` error, as in a live run."""
        updates = {}
        try:
            for key, tree, where, name in self._columns:
                value = row.get(key)
                if type(value) is str:  # _has_placeholder's common case, without the call
                    if not value.startswith(PLACEHOLDER_PREFIX):
                        continue
                elif not _has_placeholder(value):
                    continue
                new = _ABSENT if name is None else variables.get(name, _ABSENT)
                if new is not _ABSENT and not is_placeholder(new):
                    updates[key] = new  # what render_value gives a present, filled variable
                else:
                    updates[key] = render_value(tree, variables, where)
        except RowError as exc:
            errors["__schema__"] = str(exc)
            row.update(dict.fromkeys(self.schema))
        else:
            row.update(updates)

    @staticmethod
    def _add_usage(row: dict[str, Any], tokens: list[int] | None) -> None:
        """A merged row carries its tokens once, as the flat ``input_tokens`` and
        ``output_tokens`` the batch page promises: the batch tokens (``tokens``: ``None`` when
        the provider reported no usage) plus those its live outputs spent, present only when
        some are known. The shards' ``__usage__`` is what they replace."""
        usage = row.pop(USAGE, None)
        if type(usage) is not dict and not isinstance(usage, Mapping):
            usage = {}
        spent = [int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)]
        if tokens is None and not any(spent):
            return
        extra = tokens or [0, 0]
        row["input_tokens"], row["output_tokens"] = spent[0] + extra[0], spent[1] + extra[1]


def is_own_request(output: str, custom_id: str) -> bool:
    """Is ``custom_id`` an id the batch processor gives a request of ``output``?"""
    modality, _, number = custom_id.removeprefix(f"{output}-").partition("-")
    return (
        modality in MODALITIES
        and number.isdigit()
        and custom_id == custom_id_for(output, modality, int(number))
    )


def _errors(row: Mapping[str, Any]) -> dict[str, str]:
    """The row's ``__errors__`` as a dict (Arrow formats fill absent keys with null)."""
    errors = row.get(ERRORS)
    if not errors or not isinstance(errors, dict):
        return {}
    return {str(k): str(v) for k, v in errors.items() if v is not None}


def _has_placeholder(value: Any) -> bool:
    """Does a rendered schema value still wait for a batch result? (the hot path: no ABCs)"""
    if type(value) is str:
        return value.startswith(PLACEHOLDER_PREFIX)
    return isinstance(value, dict | list) and bool(find_placeholders(value))


# The fields a provider config names its answer's token limit with, first set wins.
_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _token_limit(provider_config: Any) -> tuple[int | None, str]:
    """The token limit a batch request was sent with, and the config field that set it."""
    for setting in _LIMIT_FIELDS:
        limit = getattr(provider_config, setting, None)
        if limit is not None:
            return limit, setting
    return None, "max_tokens"


__all__ = ["INVALID", "MergeTotals", "RowBuilder", "is_own_request"]
