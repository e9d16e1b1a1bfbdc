"""Provider-native batch APIs (OpenAI Files + Batches, Anthropic Message Batches, Gemini Batch)."""

from llm_kit.batch.job import BatchCounts, BatchJob, BatchJobStatus, JobState, ProviderBatch
from llm_kit.errors import BatchNotFinishedError, BatchSubmitError

__all__ = [
    "BatchCounts",
    "BatchJob",
    "BatchJobStatus",
    "BatchNotFinishedError",
    "BatchSubmitError",
    "JobState",
    "ProviderBatch",
]
