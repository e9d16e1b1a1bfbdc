"""What each provider's batch API implements: frame a request line, create, poll, cancel, read."""

from __future__ import annotations

import datetime as dt
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from llm_kit import provider_json
from llm_kit.endpoint_hints import explained
from llm_kit.errors import ConfigError, NoBatchAPIError, ProviderError
from llm_kit.providers.base import Codec, Completion
from llm_kit.providers.batch_types import BatchCounts, JobState, ProviderBatch
from llm_kit.redact import redact, redact_text
from llm_kit.transport import HttpTransport

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchLimits:
    """The most one provider batch may hold. ``max_bytes`` is the size of the uploaded JSONL
    file, so every line counts with its newline."""

    max_requests: int | None
    max_bytes: int

    def admits(self, count: int, size: int, line: bytes) -> bool:
        """Whether ``line`` (a whole JSONL line, its newline included) can join a chunk that
        holds ``count`` lines of ``size`` bytes: the one rule of both chunk planners (this
        package's ``Spooler`` and mmirage's ``ChunkSpool``)."""
        if self.max_requests is not None and count >= self.max_requests:
            return False
        return size + len(line) <= self.max_bytes


@dataclass
class Chunk:
    """A spool file of request lines that becomes one provider batch."""

    path: Path
    first: int
    count: int = 0
    bytes: int = 0
    indices: list[int] | None = None  # set for resubmissions (scattered items)
    # The label the provider batch carries where the provider has a place for one (OpenAI
    # metadata, Gemini display name): a creation whose answer was lost is found by it.
    tag: str | None = None

    def batch(self, batch_id: str, **fields: Any) -> ProviderBatch:
        """The provider batch this chunk became."""
        return ProviderBatch(
            id=batch_id,
            first=self.first,
            count=self.count,
            indices=self.indices,
            bytes=self.bytes,
            **fields,
        )


@dataclass(slots=True)
class Outcome:
    """One decoded result line: a completion, or an error with its kind and retryability.

    ``custom_id`` is the id as the provider returned it: llm_kit's own jobs use manifest
    positions (``index``), other callers of the decoders (mmirage's batch adapters) their own
    strings, so the decoders never interpret it.
    """

    custom_id: str
    completion: Completion | None = None
    error: str | None = None
    kind: str | None = None
    retryable: bool = False

    @property
    def index(self) -> int:
        """The manifest position of an llm_kit job's request; ValueError for a foreign id."""
        return int(self.custom_id)


class BatchBackend(ABC):
    """One provider's batch API. Every method that talks to the provider also returns the
    provider's answer as it came, for callers that keep it (mmirage's receipts)."""

    name: str
    endpoint: str
    limits: BatchLimits
    # Seconds allowed for the big transfers (upload, creation with inline requests, result
    # download); the transport's own timeout covers the small calls.
    transfer_timeout: float = 3600.0
    # The variables the key was read from: a refusal of the key names them (none: "the API key").
    key_names: tuple[str, ...] = ()

    def __init__(self, codec: Codec, http: HttpTransport, model: str) -> None:
        self.codec = codec
        self.http = http
        self.model = model

    @abstractmethod
    def frame(self, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request body (from the codec) wrapped as the provider's batch request line."""

    def line(self, custom_id: str, body: dict[str, Any]) -> bytes:
        """One request as a spool line (ending in a newline)."""
        framed = self.frame(custom_id, body)
        return orjson.dumps(framed, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY)

    async def create(self, chunk: Chunk) -> ProviderBatch:
        """Upload the chunk (when the provider takes files) and create the batch."""
        batch, _ = await self.submit(chunk)
        return batch

    @abstractmethod
    async def submit(self, chunk: Chunk) -> tuple[ProviderBatch, dict[str, Any]]:
        """``create``, plus the provider's answer to the creation."""

    @abstractmethod
    async def refresh(self, batch: ProviderBatch) -> dict[str, Any]:
        """Poll the provider; update the batch's state, counts and result locations."""

    @abstractmethod
    async def cancel(self, batch: ProviderBatch) -> dict[str, Any]:
        """Ask the provider to stop the batch (finished requests stay billed and fetchable)."""

    @abstractmethod
    def state_of(self, data: Mapping[str, Any]) -> JobState | None:
        """The state a provider answer reports; None for a status word this backend does not
        know (``apply`` then keeps polling it as pending)."""

    def answered(self, data: Mapping[str, Any]) -> int | None:
        """How many requests a provider answer reports done or failed, so how many result
        lines its files must hold at least (a download with fewer is damaged); None when the
        provider does not say. Unlike ``BatchCounts.errored`` it never counts the requests of
        a batch that failed as a whole, for which there is no file."""
        return None

    @abstractmethod
    def apply(self, batch: ProviderBatch, data: Mapping[str, Any]) -> None:
        """Read a provider answer into ``batch``: state, its own status word, counts, files."""

    @abstractmethod
    def results(self, batch: ProviderBatch, workdir: Path) -> AsyncIterator[Outcome]:
        """Every result line of a terminal batch (files are downloaded into ``workdir``)."""

    # Whether ``submit`` puts ``Chunk.tag`` on the batch, so that ``tag_of`` reads it back.
    tags_batches: bool = True

    @abstractmethod
    def listed(self, since: float) -> AsyncIterator[tuple[ProviderBatch, Mapping[str, Any]]]:
        """The account's batches created at ``since`` (Unix seconds) or later, newest first,
        each with the provider's answer; pages are fetched only as far as ``since``."""

    def tag_of(self, data: Mapping[str, Any]) -> str | None:
        """The tag a listed batch carries (None where the provider has no place for one)."""
        return None

    @property
    def speaker(self) -> str:
        """Who answers: the provider at its own address, else the host of the base URL (a
        gateway, a local server), as the live path's errors say."""
        return self.codec.speaker or self.codec.name

    def _failed(self, failed: ProviderError, path: str) -> ProviderError:
        """``failed`` as the live path words it: a refusal of the key (a gateway's 400 or 500
        included) names the variable and the host, and is never retried."""
        keyed = bool(self.http.secrets)
        return explained(failed, self.key_names, self.http.base_url, path, key_sent=keyed)

    # -- shared helpers ------------------------------------------------------------------

    async def call(
        self, method: str, path: str, *, what: str, names_a_route: bool = False, **kwargs: Any
    ) -> tuple[Mapping[str, str], Any]:
        """A JSON call; an error answer becomes a ProviderError naming what was attempted.
        The answer comes back redacted: a provider's answer is never trusted to hold no key.
        ``names_a_route``: ``path`` names no resource, so a 404 says the route is missing
        (NoBatchAPIError), not that something of the account is."""
        status, headers, body = await self.http.request(method, path, **kwargs)
        if status == 404 and names_a_route:
            where = redact_text(self.http.base_url, self.http.secrets)
            raise NoBatchAPIError(
                f"the server at {where} has no batch API ({method} {path} answered HTTP 404)"
            )
        if status == 404:
            raise ConfigError(
                f"{self.speaker} does not know {what} (HTTP 404): check that it belongs to this "
                "account (API key) and base URL"
            )
        if status >= 400:
            error = self.codec.error(status, headers, body)
            failed = ProviderError(
                f"{what} failed: {error}",
                status=status,
                kind=error.kind,
                retryable=error.retryable,
                retry_after=error.retry_after,
            )
            raise self._failed(failed, path)
        # Redacted as decoded: a failed batch's errors, say, may quote the key, escaped.
        return headers, redact(provider_json.loads(body), self.http.secrets) if body else None

    async def download_lines(self, path: str, target: Path, *, what: str) -> Iterator[bytes]:
        """Stream a result file to disk, then iterate its lines (bounded memory)."""
        with open(target, "wb") as f:
            status, body = await self.http.download(path, f, timeout=self.transfer_timeout)
        if status == 404:
            raise ConfigError(f"{self.speaker} does not know {what} (HTTP 404)")
        if status >= 400:
            error = self.codec.error(status, {}, body)
            failed = ProviderError(
                f"downloading {what} failed: {error}",
                status=status,
                kind=error.kind,
                retryable=error.retryable,
                retry_after=error.retry_after,
            )
            raise self._failed(failed, path)
        return _lines(target)


def decode_lines(
    lines: Iterator[Any],
    decode: Callable[[Any], Outcome],
    what: str,
    secrets: Iterable[str] = (),
) -> Iterator[Outcome]:
    """Decode each line; a line that does not parse is logged and skipped, so its item ends
    as "missing" (retryable) instead of stopping every later line of the file. An error is
    redacted (``secrets``: the transport's credentials): a gateway may quote the key."""
    words = tuple(secrets)
    for line in lines:
        try:
            outcome = decode(line)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
            why = redact_text(str(exc), words)  # a decoder's message may quote the line
            logger.warning(
                "skipped an unreadable line of %s (%s: %s)", what, type(exc).__name__, why
            )
            continue
        if outcome.error:
            outcome.error = redact_text(outcome.error, words)
        yield outcome


def _lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                yield line


def parse_rfc3339(text: str) -> float:
    """``2024-08-20T18:37:24.100435Z`` (any fraction, ``Z`` or an offset) → Unix seconds;
    0.0 for a missing or unreadable time (it then counts as old)."""
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def counts_from(state: JobState, total: int, succeeded: int, errored: int) -> BatchCounts:
    """Counts of a batch from a provider that reports only done/failed totals."""
    rest = max(0, total - succeeded - errored)
    counts = BatchCounts(total=total, succeeded=succeeded, errored=errored)
    if not state.is_terminal:
        counts.processing = rest
    elif state is JobState.EXPIRED:
        counts.expired = rest
    elif state is JobState.CANCELED:
        counts.canceled = rest
    else:
        counts.errored += rest
    return counts
