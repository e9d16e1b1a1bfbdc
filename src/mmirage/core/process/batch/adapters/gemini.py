"""``provider: gemini`` — Gemini Batch Mode (``batchGenerateContent``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_kit.batch.job import ProviderBatch
from llm_kit.providers.gemini_batch import GeminiBatchBackend
from mmirage.config.batch_provider import GeminiBatchConfig
from mmirage.core.process.batch.adapters._common import LlmKitBatchAdapter
from mmirage.core.process.batch.adapters.wire import sampling_of


class GeminiBatchAdapter(LlmKitBatchAdapter[GeminiBatchConfig]):
    """Lines ``{"key", "request"}``; small chunks are sent inline, big ones as a file.

    The batch id is the operation name (``batches/…``); its status the ``BATCH_STATE_*`` word
    (PENDING/RUNNING → in_progress, SUCCEEDED → completed, FAILED/CANCELLED/EXPIRED → failed).
    An expired Gemini batch has no results at all.
    """

    provider = "gemini"
    config_cls = GeminiBatchConfig
    backend_cls = GeminiBatchBackend

    def sampling(self, config: GeminiBatchConfig) -> dict[str, Any]:
        return sampling_of(
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_tokens=config.max_output_tokens,
            seed=config.seed,
        )

    def timeout(self, config: GeminiBatchConfig) -> float | None:
        return config.timeout_seconds

    def raw_answer(self, data: Mapping[str, Any], batch: ProviderBatch) -> dict[str, Any]:
        """The operation without its inlined responses: they are the results (up to 20 MB),
        which ``retrieve_results`` fetches; a status answer has no use for them."""
        raw = super().raw_answer(data, batch)
        raw.pop("response", None)
        metadata = raw.get("metadata")
        if isinstance(metadata, dict) and isinstance(metadata.get("output"), dict):
            output = {k: v for k, v in metadata["output"].items() if k != "inlinedResponses"}
            raw["metadata"] = {**metadata, "output": output}
        return raw
