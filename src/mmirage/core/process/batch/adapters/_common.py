"""What the built-in adapters share: mmirage's synchronous contract on top of llm_kit's async
batch backends.

Nothing here knows a wire format. A request body comes from the provider's llm_kit codec (the
same bytes as llm_kit's live and batch paths send), its line from the backend's ``frame``; every
HTTP call, status word and result line goes through the backend. This module converts the
neutral payload and the provider config into llm_kit objects, runs a backend call on a fresh
event loop (the processor calls adapters from a worker thread), and turns llm_kit ``Outcome``s
into result rows.
"""

from __future__ import annotations

import asyncio
import copy
import tempfile
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from llm_kit.batch.job import JobState, ProviderBatch
from llm_kit.batch.orphans import find_orphan
from llm_kit.providers import get_codec, provider_spec
from llm_kit.providers.base import Codec
from llm_kit.providers.batch_backend import BatchBackend
from llm_kit.schema import ResponseSchema
from llm_kit.transport import HttpTransport
from llm_kit.types import BatchConfig
from mmirage.config.batch_provider import BatchProviderConfig
from mmirage.core.process.batch.adapter import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    UNKNOWN,
    BatchSubmissionAdapter,
    BatchSubmissionResult,
    MissingCredentialsError,
    credential_env_var,
)
from mmirage.core.process.batch.adapters import BatchNotReadyError
from mmirage.core.process.batch.adapters.wire import (
    encode_payload,
    payload_schema,
    result_row,
    write_chunk,
)

_CONNECTIONS = 4  # one batch call at a time per adapter call; a few for redirects and retries
T = TypeVar("T")


class ProviderSettings(Protocol):
    """The fields every built-in provider config has."""

    provider: str
    model: str
    base_url: str | None


C = TypeVar("C", bound=ProviderSettings)


class LlmKitBatchAdapter(BatchSubmissionAdapter, Generic[C]):
    """A ``BatchSubmissionAdapter`` whose every wire detail is an llm_kit batch backend.

    Subclasses name their config and backend classes and say how the config becomes sampling
    parameters and backend options; the lifecycle below is the same for every provider.
    """

    required_credentials = ("api_key",)
    provider: ClassVar[str]
    config_cls: ClassVar[type[BatchProviderConfig]]
    backend_cls: ClassVar[type[BatchBackend]]

    def __init__(self, credentials: dict[str, str] | None = None) -> None:
        super().__init__(credentials)
        self.codec: Codec = get_codec(self.provider)
        # build_request runs once per row: what depends only on the config (the framing
        # backend, the sampling) or on the output (its schema) is built once, not per row.
        self._framers: dict[int, tuple[BatchProviderConfig, BatchBackend, dict[str, Any]]] = {}
        self._schemas: dict[int, tuple[Any, ResponseSchema | None]] = {}

    # -- what a provider adapter says ---------------------------------------------------------

    def sampling(self, config: C) -> dict[str, Any]:
        """The config's sampling fields under llm_kit's names (the codec maps them)."""
        return {}

    def backend_options(self, config: C, chunk_id: str | None) -> dict[str, Any]:
        """Extra keyword arguments of the backend class (``chunk_id`` is set on submission)."""
        return {}

    def timeout(self, config: C) -> float | None:
        """Seconds allowed for any one call, when the config sets a limit."""
        return None

    def check_custom_id(self, custom_id: str) -> None:
        """Refuse an id the provider would reject (whole batch) before anything is sent."""

    def normalize(self, state: JobState | None, batch: ProviderBatch) -> str:
        """llm_kit's state → the four statuses ``mmirage check`` reads.

        Every end other than success is ``failed``; a word llm_kit does not know is
        ``unknown`` rather than a guess.
        """
        if state is None:
            return UNKNOWN
        if state is JobState.COMPLETED:
            return COMPLETED
        return FAILED if state.is_terminal else IN_PROGRESS

    def raw_answer(self, data: Mapping[str, Any], batch: ProviderBatch) -> dict[str, Any]:
        """The provider's answer as kept in ``raw_response``, with ``id`` and ``status`` (the
        provider's word) under those names whatever the provider calls them."""
        raw = dict(data)
        raw.setdefault("id", batch.id)
        raw.setdefault("status", batch.provider_status)
        return raw

    # -- the contract ---------------------------------------------------------------------------

    def build_request(
        self, custom_id: str, payload: dict[str, Any], config: BatchProviderConfig
    ) -> dict[str, Any]:
        framer = self._framers.get(id(config))
        if framer is None or framer[0] is not config:
            settings = self._settings(config)
            framer = (config, self._backend(settings, None), self.sampling(settings))
            self._framers[id(config)] = framer
        _, backend, sampling = framer
        self.check_custom_id(custom_id)
        schema = self._schema(payload.get("response_schema"))
        body = encode_payload(self.codec, backend.model, custom_id, payload, sampling, schema)
        return backend.frame(custom_id, body)

    def _schema(self, raw: Any) -> ResponseSchema | None:
        cached = self._schemas.get(id(raw))
        if cached is None or cached[0] is not raw:
            cached = (raw, payload_schema(raw))
            self._schemas[id(raw)] = cached
        return cached[1]

    def submit_chunk(
        self, chunk_id: str, requests: Sequence[dict[str, Any]], config: BatchProviderConfig
    ) -> dict[str, Any]:
        return self._submit(chunk_id, None, requests, config)

    def submit_tagged_chunk(
        self,
        chunk_id: str,
        tag: str,
        requests: Sequence[dict[str, Any]],
        config: BatchProviderConfig,
    ) -> dict[str, Any]:
        return self._submit(chunk_id, tag, requests, config)

    def _submit(
        self,
        chunk_id: str,
        tag: str | None,
        requests: Sequence[dict[str, Any]],
        config: BatchProviderConfig,
    ) -> dict[str, Any]:
        settings = self._settings(config)
        if not requests:
            raise ValueError(f"chunk {chunk_id} holds no requests: there is nothing to submit")
        # The backends upload (or stream) from a file, so that a 200 MB chunk is never held
        # twice in memory; the directory is private to this user and removed afterwards.
        with tempfile.TemporaryDirectory(prefix="mmirage-batch-") as tmp:
            chunk = write_chunk(Path(tmp), chunk_id, requests)
            chunk.tag = tag
            batch, data = self._run(settings, chunk_id, lambda backend: backend.submit(chunk))
        raw = self.raw_answer(data, batch)
        raw["chunk_id"] = chunk_id
        return raw

    def find_submitted_chunk(
        self,
        chunk_id: str,
        tag: str,
        requests: Sequence[dict[str, Any]],
        since: float,
        known: Collection[str],
        config: BatchProviderConfig,
    ) -> dict[str, Any] | None:
        settings = self._settings(config)
        with tempfile.TemporaryDirectory(prefix="mmirage-batch-") as tmp:
            chunk = write_chunk(Path(tmp), chunk_id, requests)
            chunk.tag = tag
            found = self._run(
                settings, chunk_id, lambda backend: find_orphan(backend, chunk, since, known)
            )
        if found is None:
            return None
        raw = self.raw_answer(found[1], found[0])
        raw["chunk_id"] = chunk_id
        return raw

    def parse_submission_result(self, raw_result: dict[str, Any]) -> BatchSubmissionResult:
        backend = self._backend(None, None)
        batch = ProviderBatch(id=str(raw_result["id"]), first=0, count=0)
        backend.apply(batch, raw_result)
        state = backend.state_of(raw_result)
        return self._result(batch, raw_result, state, backend.answered(raw_result))

    def check_batch_status(
        self, provider_batch_id: str, config: BatchProviderConfig
    ) -> BatchSubmissionResult:
        settings = self._settings(config)
        batch = ProviderBatch(id=provider_batch_id, first=0, count=0)

        async def poll(
            backend: BatchBackend,
        ) -> tuple[dict[str, Any], JobState | None, int | None]:
            data = await backend.refresh(batch)
            return data, backend.state_of(data), backend.answered(data)

        data, state, answered = self._run(settings, None, poll)
        return self._result(batch, self.raw_answer(data, batch), state, answered)

    def retrieve_results(
        self, provider_batch_id: str, config: BatchProviderConfig
    ) -> list[dict[str, Any]]:
        """Every row the provider returned, also the finished part of an expired or canceled
        batch. Requests the provider returned nothing for are absent (the receipts know them)."""
        settings = self._settings(config)
        batch = ProviderBatch(id=provider_batch_id, first=0, count=0)

        async def fetch(backend: BatchBackend) -> list[dict[str, Any]]:
            await backend.refresh(batch)  # the result locations, and whether it has ended
            if not batch.state.is_terminal:
                status = batch.provider_status or "unknown"
                raise BatchNotReadyError(
                    f"the {self.provider} batch {batch.id} has not ended yet (status: "
                    f"{status}); retrieve its results once it has (mmirage check follows it)",
                    batch_id=batch.id,
                    status=batch.provider_status,
                )
            with tempfile.TemporaryDirectory(prefix="mmirage-results-") as tmp:
                return [result_row(o) async for o in backend.results(batch, Path(tmp))]

        return self._run(settings, None, fetch)

    def cancel_batch(self, provider_batch_id: str, config: BatchProviderConfig) -> None:
        settings = self._settings(config)
        batch = ProviderBatch(id=provider_batch_id, first=0, count=0)
        self._run(settings, None, lambda backend: backend.cancel(batch))

    # -- plumbing -------------------------------------------------------------------------------

    def _settings(self, config: BatchProviderConfig) -> C:
        if not isinstance(config, self.config_cls):
            raise TypeError(
                f"the {self.provider} batch adapter needs a {self.config_cls.__name__}, "
                f"got {type(config).__name__}"
            )
        return cast(C, config)

    def _backend(
        self, config: C | None, api_key: str | None, chunk_id: str | None = None
    ) -> BatchBackend:
        """A backend for ``config``. Without a key it only frames requests and reads answers
        (without a config, only reads): its transport connects at the first call, never made.
        """
        timeout = self.timeout(config) if config is not None else None
        limits = BatchConfig(request_timeout=timeout) if timeout else BatchConfig()
        base_url = config.base_url if config is not None else None
        transport = HttpTransport(
            base_url
            or provider_spec(self.provider).default_base_url
            or self.codec.default_base_url,
            self.codec.auth_headers(api_key) if api_key else {},
            max_connections=_CONNECTIONS,
            request_timeout=limits.request_timeout,
            connect_timeout=min(limits.connect_timeout, limits.request_timeout),
        )
        # Its own codec: its errors name the server at base_url when it is not the provider's.
        codec = copy.copy(self.codec).answering_at(transport.base_url)
        if config is None:
            return self.backend_cls(codec, transport, "")
        backend = self.backend_cls(
            codec, transport, config.model, **self.backend_options(config, chunk_id)
        )
        backend.key_names = (credential_env_var(config.provider, "api_key"),)  # where it came from
        if timeout:
            backend.transfer_timeout = timeout
        return backend

    def _run(
        self,
        config: C,
        chunk_id: str | None,
        work: Callable[[BatchBackend], Awaitable[T]],
    ) -> T:
        """One backend call on a fresh event loop and HTTP session (adapters are synchronous
        and may run in any thread)."""
        api_key = self.credentials.get("api_key")
        if not api_key:
            # The config's name: an adapter registered under another name reads that key.
            var = credential_env_var(config.provider, "api_key")
            raise MissingCredentialsError(
                f"talking to {config.provider} needs {var} in the environment "
                f"(export {var}=...); this adapter was created without it"
            )
        backend = self._backend(config, api_key, chunk_id)

        async def main() -> T:
            try:
                return await work(backend)
            finally:
                await backend.http.aclose()

        return asyncio.run(main())

    def _result(
        self,
        batch: ProviderBatch,
        raw: dict[str, Any],
        state: JobState | None,
        answered: int | None,
    ) -> BatchSubmissionResult:
        counts = asdict(batch.counts)
        if answered is not None:  # what merge checks each result download against
            counts["answered"] = answered
        return BatchSubmissionResult(
            provider_batch_id=batch.id,
            status=self.normalize(state, batch),
            raw_response=raw,
            provider_status=batch.provider_status,
            request_counts=counts,
        )
