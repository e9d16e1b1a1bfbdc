"""The contract between the shard runner and the processors (llm, custom, batch_api).

The runner takes rows a batch at a time (``loading_params.batch_size``); for each output, in
declared order, it renders a request per row and hands them all to the output's processor as
one ``RequestBatch`` (a sequence of ``OutputRequest``s, held as columns), which answers one
``OutputResult`` per request, in the same order. A processor never raises for one row's
failure: that row's result carries the error.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Self, overload

from mmirage.rundir import RunDir, plain_config, results_relevant

if TYPE_CHECKING:
    from llm_kit.request_stats import RequestStats


@dataclass(slots=True)
class OutputRequest:
    row_key: str  # stable across runs: "<dataset index>:<split or ''>:<row id>"
    output_name: str
    prompt: str | None  # the rendered prompt (None for custom outputs)
    image_urls: list[str] = field(default_factory=list)
    # Inputs and earlier outputs: the row's own dict, read-only for processors.
    variables: dict[str, Any] = field(default_factory=dict)
    row: dict[str, Any] = field(default_factory=dict)  # the raw source row
    # The row's position over all datasets and splits, in config order: unique in the pipeline.
    source_index: int = 0


class RequestBatch(Sequence[OutputRequest]):
    """One output's requests for a group of rows, held as columns: rows are many, so the runner
    makes no object per request. Indexing or iterating gives ``OutputRequest``s, each built
    then (a sequence, not a list: ``list(requests)`` makes one); the ``llm`` processor reads
    the columns themselves."""

    __slots__ = (
        "image_urls",
        "output_name",
        "prompts",
        "row_keys",
        "rows",
        "source_indexes",
        "variables",
    )

    def __init__(
        self,
        output_name: str,
        row_keys: list[str],
        prompts: list[str | None],
        image_urls: list[list[str]] | None,  # None: no request has an image
        variables: list[dict[str, Any]],
        rows: list[dict[str, Any]],
        source_indexes: list[int],
    ) -> None:
        self.output_name, self.row_keys, self.prompts = output_name, row_keys, prompts
        self.image_urls, self.variables, self.rows = image_urls, variables, rows
        self.source_indexes = source_indexes

    @classmethod
    def of(cls, requests: Sequence[OutputRequest]) -> RequestBatch:
        """``requests`` as columns (a ``RequestBatch`` as it is)."""
        if isinstance(requests, RequestBatch):
            return requests
        return cls(
            requests[0].output_name if requests else "",
            [r.row_key for r in requests],
            [r.prompt for r in requests],
            [r.image_urls for r in requests],
            [r.variables for r in requests],
            [r.row for r in requests],
            [r.source_index for r in requests],
        )

    def __len__(self) -> int:
        return len(self.row_keys)

    @overload
    def __getitem__(self, index: int) -> OutputRequest: ...
    @overload
    def __getitem__(self, index: slice) -> list[OutputRequest]: ...
    def __getitem__(self, index: int | slice) -> OutputRequest | list[OutputRequest]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        urls = self.image_urls
        return OutputRequest(
            self.row_keys[index],
            self.output_name,
            self.prompts[index],
            [] if urls is None else urls[index],
            self.variables[index],
            self.rows[index],
            self.source_indexes[index],
        )

    def __iter__(self) -> Iterator[OutputRequest]:
        return map(self.__getitem__, range(len(self.row_keys)))


@dataclass(slots=True)
class OutputResult:
    value: Any = None  # text, a parsed JSON dict, a placeholder, or a custom value
    error: str | None = None  # one sentence; value is None then, or a custom fallback_value
    retryable: bool = False
    fallback: bool = False  # value is the processor's configured fallback: used, error recorded
    input_tokens: int = 0
    output_tokens: int = 0
    # Why generation stopped, in the provider's words (``stop``, ``length``, ``max_tokens``...).
    finish_reason: str | None = None
    # What kind of failure ``error`` is (llm_kit's ``error_kind``: ``truncated``, ``validation``,
    # ``rate_limit``...); None for a success.
    kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Take:
    """What ``deliver`` hands each result to: ``take(index, result)``; and, for a successful
    plain answer, ``take.answer(index, value, input_tokens, output_tokens)``, the same without
    an ``OutputResult`` to build for it (answers come by millions)."""

    __slots__ = ("_result", "answer")

    def __init__(
        self,
        result: Callable[[int, OutputResult], None],
        answer: Callable[[int, Any, int, int], None],
    ) -> None:
        self._result, self.answer = result, answer

    def __call__(self, index: int, result: OutputResult) -> None:
        self._result(index, result)


def answer_of(take: Callable[[int, OutputResult], None]) -> Callable[[int, Any, int, int], None]:
    """``take``'s plain-answer entry: its own (a ``Take``), else one that builds the result."""
    if isinstance(take, Take):
        return take.answer

    def answer(index: int, value: Any, input_tokens: int, output_tokens: int) -> None:
        take(index, OutputResult(value, None, False, False, input_tokens, output_tokens))

    return answer


class Processor(ABC):
    """What the shard runner needs of a processor. Subclass it, implement ``process``, and
    override the hooks below where the defaults do not fit; the runner calls every hook.

    A processor is built once per shard (``from_config``), used for every row group of every
    dataset of that shard, then closed (``aclose``) — except processors handed to
    ``run_shard`` by the caller, which the caller closes.
    """

    @classmethod
    def from_config(cls, config: Any, context: RunContext | None = None) -> Self:
        """The processor for one ``processors[]`` entry. Fail here, before any row runs, on
        what can be checked up front (a missing key, script or function)."""
        return cls(config, context)  # type: ignore[call-arg]

    def request_identity(self, output: Any) -> Any:
        """What, beside the row, decides the answers to ``output``'s requests, as JSON-able
        data; ``None``: its answers are not stored (the batch spool keeps its own).

        The runner stores each answer under a digest of this, the row's key and what was
        rendered for the row (its prompt; for an output without one, its variables), and
        takes it from there instead of asking again (``core/shard/answers.py``): after a
        kill, a retry, or a config edit that left this output's requests unchanged. By
        default: the processor's class, its ``config`` less what only paces it (rpm, retries,
        pools...: ``rundir.results_relevant``) — for an API that is the provider, base URL,
        model, sampling and structured output — and the output's settings but its prompt
        template (the rendered prompt is in the digest)."""
        settings = results_relevant(plain_config(getattr(self, "config", None)))
        shaped = {k: v for k, v in plain_config(output).items() if k != "prompt"}
        return {"processor": type(self).__qualname__, "settings": settings, "output": shaped}

    @property
    def group_rows(self) -> int:
        """How many rows the runner should hand over at once (at least ``batch_size``)."""
        return 1

    @abstractmethod
    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        """One result per request, same order. ``output`` is the output's config."""

    async def stream(
        self, output: Any, requests: Sequence[OutputRequest]
    ) -> AsyncIterator[tuple[int, OutputResult]]:
        """``(index, result)`` pairs as results arrive, so the runner journals each at once;
        by default ``process``'s results, in order, once they are all back."""
        results = await self.process(output, requests)
        if len(results) != len(requests):
            raise RuntimeError(
                f"the processor of output '{output.name}' answered {len(results)} results for "
                f"{len(requests)} requests"
            )
        for pair in enumerate(results):
            yield pair

    async def deliver(
        self,
        output: Any,
        requests: Sequence[OutputRequest],
        take: Callable[[int, OutputResult], None],
    ) -> None:
        """Call ``take(index, result)`` for each result as it arrives (the runner journals it
        there) and return once every request has one; by default ``stream``'s pairs. An
        exception from ``take`` ends the call: what was not sent yet is not paid for. A plain
        successful answer may go to ``answer_of(take)(index, value, input_tokens,
        output_tokens)`` instead, which builds no ``OutputResult``."""
        got = 0
        results = self.stream(output, requests)
        try:
            async for index, result in results:
                take(index, result)
                got += 1
        finally:
            close = getattr(results, "aclose", None)  # a plain async iterator has none
            if close is not None:
                await close()
        if got != len(requests):
            raise RuntimeError(
                f"the processor of output '{output.name}' answered {got} results for "
                f"{len(requests)} requests"
            )

    def resume_at(self, source_index: int) -> None:  # noqa: B027 - most processors need nothing
        """Called before a dataset's rows are read: ``source_index`` is where the unfinished
        rows start (what an interrupted run already sent for them is for the processor to
        know; the batch spool does)."""

    async def drain(self) -> int | None:
        """Called when the shard must stop (a signal, its time limit): start no new request,
        and return once those under way have their results (handed to ``deliver``'s ``take``
        as usual, so they are stored); how many came back, when known. The runner stops once
        every processor's drain returned (or its time is up); by default there is nothing to
        wait for."""
        return None

    async def finish(self) -> str | None:
        """Called when every row of a dataset has a result, before the shard is published;
        returns one line for the run's report, or None."""
        return None

    def request_stats(self) -> RequestStats | None:
        """The live requests' counters (retries by cause, cool-down, tokens, model) for the
        progress lines and the shard's report; ``None``: it sends none (by default)."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - nothing to release by default
        """Release what the processor holds (clients, servers, worker pools)."""


class SubmittedRequests(Protocol):
    """What a shard remembers of the requests a processor submitted elsewhere (``batch_api``):
    under each request id, a digest of the request last submitted under it."""

    def recall(self, ids: Sequence[str]) -> dict[str, str]:
        """The digest last submitted under each of ``ids`` that has one."""

    def remember(self, submitted: Iterable[tuple[str, str]]) -> None:
        """``(id, digest)`` of requests now held by the provider."""

    def count(self, *, reused: int, sent: int) -> None:
        """For the shard's report: requests taken as submitted, and requests sent."""


@dataclass(frozen=True)
class RunContext:
    """What a processor may need to know about the run that builds it."""

    run_id: str  # one per ``mmirage run`` invocation (shared by the shards it runs)
    shard_id: int
    run_dir: RunDir  # the pipeline's identity and files (``mmirage.rundir``)
    export_prompts: str | None = None  # dry run: write requests here instead of submitting
    fresh: bool = False  # --fresh: forget what earlier runs of this shard left, ask again
    # The shard is computed again (--recompute, or its configuration changed).
    recompute: bool = False
    submitted: SubmittedRequests | None = None  # None: nothing is remembered

    @property
    def num_shards(self) -> int:
        return self.run_dir.num_shards

    @property
    def state_dir(self) -> str:
        """This pipeline's state folder (``<state_dir>/<pipeline id>``)."""
        return str(self.run_dir.state)
