"""llm_kit: talk to LLMs at scale, live (rate-limited, concurrent) or through batch APIs."""

from llm_kit.batch import BatchJob, BatchJobStatus, JobState
from llm_kit.client import LLM
from llm_kit.errors import (
    BatchItemFailed,
    BatchNotFinishedError,
    BatchSubmitError,
    CompletionError,
    ConfigError,
    ItemError,
    KeyRefusedError,
    LLMKitError,
    MissingAPIKeyError,
    OrphanBatchUnclearError,
    ProviderError,
    ResponseValidationError,
)
from llm_kit.hf_datasets import items_from_dataset, results_to_dataset
from llm_kit.item_queue import ItemQueue
from llm_kit.types import (
    BatchConfig,
    BatchItem,
    BatchResult,
    ImagePart,
    Message,
    TextPart,
    Usage,
)

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "BatchConfig",
    "BatchItem",
    "BatchItemFailed",
    "BatchJob",
    "BatchJobStatus",
    "BatchNotFinishedError",
    "BatchResult",
    "BatchSubmitError",
    "CompletionError",
    "ConfigError",
    "ImagePart",
    "ItemError",
    "ItemQueue",
    "JobState",
    "KeyRefusedError",
    "LLMKitError",
    "Message",
    "MissingAPIKeyError",
    "OrphanBatchUnclearError",
    "ProviderError",
    "ResponseValidationError",
    "TextPart",
    "Usage",
    "items_from_dataset",
    "results_to_dataset",
]
