"""Exceptions. Each message is one readable sentence that says what to do next."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, Generic, Protocol, TypeVar


class LLMKitError(Exception):
    """Base class of every error llm_kit raises on purpose."""


class ConfigError(LLMKitError, ValueError):
    """The client or an item was set up wrongly: fix the call, then run again."""


class MissingAPIKeyError(ConfigError):
    """No API key was given and the provider's environment variable is unset."""


class MissingExtraError(ConfigError):
    """A feature needs a package that an optional extra of the mmirage distribution installs
    (``datasets``: the ``hf`` extra); the message names the extra and the command."""


def require_extra(module: str, extra: str, feature: str) -> ModuleType:
    """``module`` imported, or ``MissingExtraError`` saying which extra of the mmirage
    distribution brings it (mmirage raises the same sentence as its own ``MissingExtra``).

    The command names the checkout: ``pip install 'mmirage[...]'`` would fetch the namesake
    project on PyPI.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:  # the package, or one it needs (a partial install)
        missing = exc.name or module.partition(".")[0]
        raise MissingExtraError(
            f"{feature} needs the `mmirage[{extra}]` extra (the {missing} package is not "
            f"installed): run `pip install -e '.[{extra}]'` in the mmirage checkout"
        ) from None


class ItemError(LLMKitError, ValueError):
    """One item cannot be sent as it is (unreadable image, unsupported type, bad schema).

    It is recorded as that item's error, of ``kind``; the batch goes on. A ValueError, so that
    callers that catch bad values (mmirage's batch processor) catch it too.
    """

    kind = "invalid_item"
    retryable = False  # the item as it is fails the same way again
    usage: Any = None  # the tokens paid for the item before it failed so (llm_kit.types.Usage)


class ImageTypeError(ItemError):
    """An image of a type the provider does not take (Anthropic: JPEG, PNG, GIF, WebP).
    ``media_type`` is the type it has; an item's error, unless the caller decides otherwise
    (mmirage's batch processor stops the run before anything is submitted)."""

    def __init__(self, message: str, *, media_type: str) -> None:
        super().__init__(message)
        self.media_type = media_type


class ProviderError(LLMKitError):
    """The provider answered with an error, or could not be reached.

    ``retryable`` says whether sending the same request again may succeed;
    ``retry_after`` is the server's requested wait in seconds, when it gave one;
    ``budget_spent`` marks a 429 whose rate-limit headers (or Gemini's quota details) say the
    budget is spent: then every request waits, not only this one (``llm_kit.ratelimit``).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        kind: str = "provider_error",
        retryable: bool = False,
        retry_after: float | None = None,
        budget_spent: bool = False,
    ) -> None:
        # One line: a server's body (a pretty-printed JSON, a traceback) lands in a row's
        # recorded error and in the CLI's one-sentence report.
        super().__init__(" ".join(message.split()))
        self.status = status
        self.kind = kind
        self.retryable = retryable
        self.retry_after = retry_after
        self.budget_spent = budget_spent


class KeyRefusedError(ProviderError):
    """The endpoint refused the key: a 401/403, or a gateway's answer about its key in another
    status (a LiteLLM proxy: HTTP 500 without a key, 400 "No connected db." with a wrong one).
    Never retryable: no item can succeed, so a live run stops (``llm_kit.endpoint_hints``)."""


class ConnectError(ProviderError):
    """No connection to the endpoint could be opened (refused, unknown host, connect timeout,
    TLS): the request never reached it. Retryable; ``where`` is the endpoint's URL (redacted).
    The live pool stops sending when every attempt fails so (``llm_kit.breaker``)."""

    def __init__(self, message: str, *, where: str, kind: str = "connection_error") -> None:
        super().__init__(message, kind=kind, retryable=True)
        self.where = where


class DialectIgnoredError(ItemError):
    """The server answers a ``structured_output`` named by the caller with HTTP 200 but does
    not follow it: the model's first answers all missed the schema. Each item ends with this
    error, the later ones without being sent; retryable, since the item itself is fine once
    the dialect is changed."""

    kind = "structured_output_ignored"
    retryable = True


class NoBatchAPIError(ConfigError):
    """The server has no batch API (a 404 on ``/files`` or ``/batches``, as vLLM, llama.cpp
    and llama-cpp-python answer): nothing was created, and the requests must go live.
    ``finding`` is what was found, for a caller that words the advice its own way."""

    def __init__(self, finding: str) -> None:
        super().__init__(f"{finding}: send the requests live instead")
        self.finding = finding


class ResponseValidationError(LLMKitError):
    """The model's answer did not parse or did not match the item's ``response_model``."""


class CompletionError(LLMKitError):
    """``LLM.complete`` failed; ``result`` is the BatchResult with the error and its kind."""

    def __init__(self, result: Any) -> None:
        super().__init__(result.error or "the request failed")
        self.result = result


class BatchItemFailed(LLMKitError):
    """Raised by the pipeline when ``BatchConfig.on_failure == "raise"`` and an item failed."""

    def __init__(self, item_id: str, error: str) -> None:
        super().__init__(f"item {item_id!r} failed: {error}")
        self.item_id = item_id
        self.error = error


class OrphanBatchUnclearError(LLMKitError):
    """An interrupted creation may have left a batch at the provider, but more than one of the
    account's batches fits it and none can be told apart yet (Anthropic batches carry no
    tag). Nothing was created: run again once those batches have ended, when their results
    name their requests."""


class SavableJob(Protocol):
    """What ``BatchSubmitError.job`` offers: ``llm_kit.batch.BatchJob`` is one. Described here
    so that the exceptions import nothing above them (the job module raises them)."""

    @property
    def batch_ids(self) -> list[str]:
        """The provider batch ids created so far."""
        ...

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the handle, to poll, fetch or resubmit from another process."""
        ...


JobT = TypeVar("JobT", bound=SavableJob)


class BatchSubmitError(LLMKitError, Generic[JobT]):
    """Some batches of a job were created before a failure; ``job`` holds them (the
    ``llm_kit.batch.BatchJob`` that ``submit_batch`` was making). Generic over the job's
    type, so that ``except BatchSubmitError as exc: llm.resubmit_failed(exc.job)`` type-checks
    although this module cannot name ``BatchJob`` (the job module raises these errors)."""

    def __init__(self, message: str, job: JobT) -> None:
        super().__init__(message)
        self.job: JobT = job


class BatchNotFinishedError(LLMKitError):
    """Results were asked for while some of the job's batches are still running."""
