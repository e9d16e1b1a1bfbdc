"""The provider contract of the ``batch_api`` processor (the spec's "Submission Adapter").

An adapter turns a neutral payload into one provider request line, estimates its size, submits
a chunk of such lines as one provider batch, reports a batch's status and downloads its results.
Every method is synchronous (the contract a user implements); the processor runs them in a
worker thread so the shard's event loop never blocks.

The neutral payload built by the processor, for every provider:

* ``messages`` — OpenAI chat format: ``[{"role": "user", "content": str | [parts]}]`` where a
  part is ``{"type": "text", "text": ...}`` or ``{"type": "image_url", "image_url": {"url": ...}}``
  (local images already inlined as ``data:`` URLs, http(s) URLs as given);
* ``response_schema`` — the output's JSON schema (``None`` for plain text);
* ``expected_schema`` — the schema's top-level field names (the original's key, kept for
  custom adapters written against it), present only for JSON outputs.

A result row (``retrieve_results``) is a dict with ``custom_id`` and either ``generated_text``
(``status`` ``"succeeded"``) or ``status`` ``"error"`` plus ``error_message``; optional keys:
``input_tokens`` / ``output_tokens`` (only when the provider reports usage), ``error_kind``
(``expired``, ``canceled``, ``rate_limit``…), ``retryable`` and ``finish_reason`` (why the
answer ended, in the provider's words: merge reports a JSON answer cut at the token limit as
such).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mmirage.config.batch_provider import BatchProviderConfig
from mmirage.config.credentials import credential_env_var
from mmirage.errors import UserError

COMPLETED, FAILED, IN_PROGRESS, UNKNOWN = "completed", "failed", "in_progress", "unknown"
NORMALIZED_STATUSES = (COMPLETED, FAILED, IN_PROGRESS, UNKNOWN)


@dataclass
class BatchSubmissionResult:
    """A provider batch as ``mmirage check`` sees it: its id and a normalized status.

    ``status`` is one of ``completed``, ``failed``, ``in_progress``, ``unknown``. Built-in
    adapters also fill ``provider_status`` (the provider's own word, e.g. ``expired``) and
    ``request_counts`` (``total``, ``succeeded``, ``errored``, ``expired``, ``canceled``,
    ``processing``) when known, and ``answered``: how many results the provider reports it
    holds (done or failed), which merge checks every download against.
    """

    provider_batch_id: str
    status: str
    raw_response: dict[str, Any] = field(default_factory=dict)
    provider_status: str | None = None
    request_counts: dict[str, int] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        return self.status in (COMPLETED, FAILED)


class MissingCredentialsError(UserError, RuntimeError):
    """A required ``<PROVIDER>_<KEY>`` environment variable is not set."""


# A provider's own words for a batch's state → the four normalized statuses (see
# ``BatchSubmissionAdapter.status_words``).
STATUS_WORDS: dict[str, str] = {
    **dict.fromkeys(("completed", "ended", "succeeded", "success", "done"), COMPLETED),
    **dict.fromkeys(("failed", "error", "errored", "expired", "cancelled", "canceled"), FAILED),
    **dict.fromkeys(
        (
            "validating",
            "queued",
            "pending",
            "running",
            "in_progress",
            "processing",
            "finalizing",
            "cancelling",
            "canceling",
        ),
        IN_PROGRESS,
    ),
}


class BatchSubmissionAdapter(ABC):
    """Subclass per provider; register with ``BatchAdapterRegistry.register(name, cls)``.

    ``required_credentials`` names keys read from ``<PROVIDER>_<KEY>`` environment variables;
    they are checked when the adapter is created (before any row is processed) and exposed as
    ``self.credentials`` — never from the YAML, never written anywhere. A subclass may have a
    constructor of its own, with no parameter or with defaults for all of them (mmirage builds
    it as ``cls()``, as the original did, then sets ``credentials``), calling this one or not.
    ``status_words`` maps a provider's words to the normalized statuses
    (``_normalize_status``); extend it in a subclass for a provider's own vocabulary.
    """

    required_credentials: ClassVar[tuple[str, ...]] = ()
    status_words: ClassVar[dict[str, str]] = STATUS_WORDS

    def __init__(self, credentials: dict[str, str] | None = None) -> None:
        self.credentials = dict(credentials or {})

    @property
    def credentials(self) -> dict[str, str]:
        """The keys ``required_credentials`` named, from the environment (empty until set)."""
        found: dict[str, str] = self.__dict__.get("_credentials", {})
        return found

    @credentials.setter
    def credentials(self, value: dict[str, str]) -> None:
        self.__dict__["_credentials"] = dict(value)

    @classmethod
    def read_credentials(cls, provider: str, *, allow_missing: bool = False) -> dict[str, str]:
        found: dict[str, str] = {}
        missing: list[str] = []
        for key in cls.required_credentials:
            var = credential_env_var(provider, key)
            value = os.environ.get(var, "")
            if value:
                found[key] = value
            else:
                missing.append(var)
        if missing and not allow_missing:
            names = " and ".join(missing)
            raise MissingCredentialsError(
                f"the batch_api provider '{provider}' needs {names} in the environment "
                f"(export {missing[0]}=...; keys are never read from the config, and "
                "--export-prompts makes a dry run without one)"
            )
        return found

    @abstractmethod
    def build_request(
        self, custom_id: str, payload: dict[str, Any], config: BatchProviderConfig
    ) -> dict[str, Any]:
        """The provider's request line for one payload (a JSON-serializable dict)."""

    def estimate_request_bytes(self, request: dict[str, Any]) -> int:
        """An upper bound of the request's serialized UTF-8 size (without the newline)."""
        import orjson

        return len(orjson.dumps(request))

    @abstractmethod
    def submit_chunk(
        self, chunk_id: str, requests: Sequence[dict[str, Any]], config: BatchProviderConfig
    ) -> dict[str, Any]:
        """Submit the requests as one provider batch; return the provider's raw answer."""

    def submit_tagged_chunk(
        self,
        chunk_id: str,
        tag: str,
        requests: Sequence[dict[str, Any]],
        config: BatchProviderConfig,
    ) -> dict[str, Any]:
        """``submit_chunk``, with ``tag`` on the batch where the provider has room for one, so
        that ``find_submitted_chunk`` can find it. The default ignores the tag."""
        return self.submit_chunk(chunk_id, requests, config)

    def find_submitted_chunk(
        self,
        chunk_id: str,
        tag: str,
        requests: Sequence[dict[str, Any]],
        since: float,
        known: Collection[str],
        config: BatchProviderConfig,
    ) -> dict[str, Any] | None:
        """The raw answer (as ``submit_chunk``'s) of the batch that an interrupted
        ``submit_tagged_chunk(chunk_id, tag, requests)`` created, started at ``since`` (Unix
        seconds); None when the provider has none. ``known``: batch ids that belong to other
        chunks. The default cannot look and returns None: the chunk is then created again."""
        return None

    @abstractmethod
    def parse_submission_result(self, raw_result: dict[str, Any]) -> BatchSubmissionResult:
        """Normalize ``submit_chunk``'s raw answer."""

    @abstractmethod
    def check_batch_status(
        self, provider_batch_id: str, config: BatchProviderConfig
    ) -> BatchSubmissionResult:
        """The batch's latest status."""

    @abstractmethod
    def retrieve_results(
        self, provider_batch_id: str, config: BatchProviderConfig
    ) -> Sequence[dict[str, Any]]:
        """Every result row of a finished batch (see the module docstring for the keys)."""

    def cancel_batch(self, provider_batch_id: str, config: BatchProviderConfig) -> None:
        """Ask the provider to stop the batch; optional (built-ins implement it)."""
        raise NotImplementedError(f"{type(self).__name__} cannot cancel batches")

    @classmethod
    def _normalize_status(cls, status: str | None) -> str:
        """A helper for adapters: a provider's word → one of the four normalized statuses,
        through ``status_words`` (``unknown`` for a word it does not hold)."""
        return cls.status_words.get((status or "").strip().lower(), UNKNOWN)


__all__ = [
    "COMPLETED",
    "FAILED",
    "IN_PROGRESS",
    "NORMALIZED_STATUSES",
    "UNKNOWN",
    "BatchSubmissionAdapter",
    "BatchSubmissionResult",
    "MissingCredentialsError",
    "credential_env_var",
]
