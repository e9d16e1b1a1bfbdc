"""``provider: anthropic`` — Message Batches."""

from __future__ import annotations

import re
from typing import Any

from llm_kit.batch.job import JobState, ProviderBatch
from llm_kit.providers.anthropic_batch import AnthropicBatchBackend
from mmirage.config.batch_provider import AnthropicBatchConfig
from mmirage.core.process.batch.adapter import COMPLETED, FAILED
from mmirage.core.process.batch.adapters._common import LlmKitBatchAdapter
from mmirage.core.process.batch.adapters.wire import sampling_of

_CUSTOM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class AnthropicBatchAdapter(LlmKitBatchAdapter[AnthropicBatchConfig]):
    """Requests ``{"custom_id", "params"}`` sent inline; results read with their usage.

    Images: http(s) URLs become ``url`` sources, ``data:`` URLs ``base64`` sources; any type
    but JPEG, PNG, GIF and WebP raises ValueError before submission (llm_kit's codec).
    """

    provider = "anthropic"
    config_cls = AnthropicBatchConfig
    backend_cls = AnthropicBatchBackend

    def sampling(self, config: AnthropicBatchConfig) -> dict[str, Any]:
        # The config refuses temperature together with top_p, so at most one is set.
        return sampling_of(
            max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p
        )

    def timeout(self, config: AnthropicBatchConfig) -> float | None:
        return config.timeout_seconds

    def check_custom_id(self, custom_id: str) -> None:
        # One illegal id makes Anthropic refuse the whole batch: say which, before sending.
        if not _CUSTOM_ID.fullmatch(custom_id):
            raise ValueError(
                f"Anthropic batch custom_ids must match ^[A-Za-z0-9_-]{{1,64}}$, got "
                f"{custom_id!r}: rename the output (letters, digits, '_' and '-')"
            )

    def normalize(self, state: JobState | None, batch: ProviderBatch) -> str:
        """``ended`` is ``completed`` when at least one request succeeded, else ``failed``.

        A batch whose requests were all canceled, expired or errored has nothing to merge, so
        it is failed; a partly canceled or expired batch is completed (its
        finished results are retrievable, the others come back as error rows).
        """
        if state is not None and state.is_terminal:
            return COMPLETED if batch.counts.succeeded else FAILED
        return super().normalize(state, batch)
