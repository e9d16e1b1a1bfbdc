"""``provider: openai`` — Files + Batches (and OpenAI-compatible gateways through base_url)."""

from __future__ import annotations

from typing import Any

from llm_kit.providers.openai_batch import OpenAIBatchBackend
from mmirage.config.batch_provider import OpenAIBatchConfig
from mmirage.core.process.batch.adapters._common import LlmKitBatchAdapter
from mmirage.core.process.batch.adapters.wire import sampling_of


class OpenAIBatchAdapter(LlmKitBatchAdapter[OpenAIBatchConfig]):
    """Lines ``{"custom_id", "method", "url", "body"}``; one uploaded file per chunk.

    Results come from both the output and the error file, so per-request HTTP errors and
    ``batch_expired``/``batch_cancelled`` rows are reported, also for expired batches.
    """

    provider = "openai"
    config_cls = OpenAIBatchConfig
    backend_cls = OpenAIBatchBackend

    def sampling(self, config: OpenAIBatchConfig) -> dict[str, Any]:
        return sampling_of(
            temperature=config.temperature,
            top_p=config.top_p,
            max_tokens=config.max_tokens,
            max_completion_tokens=config.max_completion_tokens,
            seed=config.seed,
        )

    def backend_options(self, config: OpenAIBatchConfig, chunk_id: str | None) -> dict[str, Any]:
        # The chunk id travels in the batch metadata, as in the original: a batch found in
        # the provider's dashboard names the chunk (and so the receipt) it came from.
        metadata = dict(config.metadata)
        if chunk_id is not None:
            metadata["chunk_id"] = chunk_id
        return {"endpoint": config.batch_endpoint, "metadata": metadata}
