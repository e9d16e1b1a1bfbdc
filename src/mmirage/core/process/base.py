"""The contract between the shard runner and the processors (llm, custom, batch_api).

The runner takes rows a batch at a time (``loading_params.batch_size``); for each output, in
declared order, it renders one ``OutputRequest`` per row and hands the whole list to the
output's processor, which answers one ``OutputResult`` per request, in the same order. A
processor never raises for one row's failure: that row's result carries the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class OutputRequest:
    row_key: str  # stable across runs: "<dataset index>:<split or ''>:<row id>"
    output_name: str
    prompt: str | None  # the rendered prompt (None for custom outputs)
    image_urls: list[str] = field(default_factory=list)
    # Inputs and earlier outputs: the row's own dict, read-only for processors.
    variables: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)  # the raw source row
    # The row's position over all datasets and splits, in config order: unique in the pipeline.
    source_index: int = 0


@dataclass(slots=True)
class OutputResult:
    value: Any = None  # text, a parsed JSON dict, a placeholder, or a custom value
    error: str | None = None  # one sentence; value is None then, or a custom fallback_value
    retryable: bool = False
    fallback: bool = False  # value is the processor's configured fallback: used, error recorded
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


class Processor(Protocol):
    """What the runner needs of a processor (built from its config, closed after the shard)."""

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        """One result per request, same order. ``output`` is the output's config."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class RunContext:
    """What a processor may need to know about the run that builds it."""

    run_id: str  # one per ``mmirage run`` invocation (shared by the shards it runs)
    shard_id: int
    num_shards: int
    state_dir: str  # this pipeline's state folder (``<state_dir>/<pipeline id>``)
    export_prompts: str | None = None  # dry run: write requests here instead of submitting
    fresh: bool = False  # --recompute: forget what earlier runs of this shard left
    pipeline_id: str = ""  # which pipeline, and which configuration of it, made a receipt
    fingerprint: str = ""
