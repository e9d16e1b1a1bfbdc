"""Provider-native batch APIs (OpenAI Files + Batches, Anthropic Message Batches, Gemini Batch)."""

from llm_kit.batch.api import BatchSubmitError
from llm_kit.batch.job import BatchCounts, BatchJob, BatchJobStatus, JobState, ProviderBatch
from llm_kit.batch.runner import BatchNotFinishedError

__all__ = [
    "BatchCounts",
    "BatchJob",
    "BatchJobStatus",
    "BatchNotFinishedError",
    "BatchSubmitError",
    "JobState",
    "ProviderBatch",
]
