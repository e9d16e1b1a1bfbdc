"""The whole configuration, as returned by ``load_mmirage_config``."""

from __future__ import annotations

from dataclasses import dataclass, field

from mmirage.config.execution import ExecutionParams
from mmirage.config.loading_params import LoadingParams
from mmirage.config.processing_params import OutputVar, ProcessingParams
from mmirage.config.processors import ProcessorConfig
from mmirage.errors import MmirageError


@dataclass
class MMirageConfig:
    """The whole YAML file: its four top-level sections."""

    processors: list[ProcessorConfig]
    """What computes the outputs: one entry per processor, its `type` (`llm`, `batch_api`,
    `custom`, or a plugin's) choosing its fields."""
    loading_params: LoadingParams
    """The input datasets, their sharding, and the pipeline's state folder."""
    processing_params: ProcessingParams
    """The per-row variables, the outputs computed from them, and the result rows' shape."""
    execution_params: ExecutionParams = field(default_factory=ExecutionParams)
    """Where the shards run (locally or on SLURM), retries and merging. Optional."""
    # Where the config came from (absolute file path, or None for a dict); not a YAML key.
    config_path: str | None = field(default=None, metadata={"internal": True})

    @property
    def uses_batch_api(self) -> bool:
        """Whether a processor submits provider batches: check, merge and retry follow them,
        and token counts are known only once their results are merged."""
        return any(p.type == "batch_api" for p in self.processors)

    def processor_for(self, output: OutputVar) -> ProcessorConfig:
        """The processor that computes ``output`` (the loader has checked it exists and is
        unambiguous)."""
        return select_processor(self.processors, output)


class ProcessorSelectionError(MmirageError, LookupError):
    pass


def select_processor(processors: list[ProcessorConfig], output: OutputVar) -> ProcessorConfig:
    candidates = [p for p in processors if p.type == output.type]
    if output.processor is not None:
        for candidate in candidates:
            if candidate.name == output.processor:
                return candidate
        named = [p.name for p in candidates if p.name]
        raise ProcessorSelectionError(
            f"names no {output.type} processor '{output.processor}'; "
            f"{output.type} processors with a name: {named or 'none'}"
        )
    if not candidates:
        raise ProcessorSelectionError(
            f"output '{output.name}' has type {output.type} but no processor of type "
            f"{output.type} is declared under processors"
        )
    if len(candidates) > 1:
        names = [p.name for p in candidates]
        raise ProcessorSelectionError(
            f"output '{output.name}' has type {output.type} and there are {len(candidates)} "
            f"{output.type} processors {names}; pick one with 'processor: <name>'"
        )
    return candidates[0]
