"""``type: llm``: live generation through one ``llm_kit.LLM`` (an API, an OpenAI-compatible
server through ``base_url``, or the embedded local model).

Each row's failure becomes that row's ``OutputResult.error``: a row never silently gets ``""``
or ``{}``, so every failure is recorded and can be retried. A
``server_args.model_path`` with no ``base_url`` (and no ``message_format``) starts an SGLang or
vLLM server for the shard (see ``server_launcher``), which ``aclose`` stops.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.config.credentials import key_from_named_variable
from mmirage.config.errors import ConfigError
from mmirage.config.sampling import flat_sampling
from mmirage.core.process.base import (
    OutputRequest,
    OutputResult,
    Processor,
    RequestBatch,
    answer_of,
)
from mmirage.core.process.engine_location import find_engine
from mmirage.core.process.server_launcher import LaunchedServer, launch_server
from mmirage.core.process.server_launcher import wants_server as _wants_server
from mmirage.core.process.shared_stream import SharedStream

if TYPE_CHECKING:  # llm_kit and pydantic are imported when a processor is built, not before
    from pydantic import BaseModel

    from llm_kit import LLM, BatchConfig, BatchItem, BatchResult
    from llm_kit.request_stats import RequestStats
    from mmirage.config.processors import LLMProcessorConfig
    from mmirage.core.process.base import RunContext

# default_sampling_params keys that llm_kit takes as named sampling arguments.
_NAMED_SAMPLING = ("temperature", "top_p", "max_tokens", "seed", "stop")
# LLMProcessorConfig fields copied into llm_kit.BatchConfig when set.
_PACING_FIELDS = (
    "worker_concurrency",
    "input_buffer_size",
    "rpm",
    "tpm",
    "max_retries",
    "validation_retries",
    "request_timeout",
)
_LOCAL_MODEL_NAME = "local"  # LLM(model=...) must be non-empty; the embedded default is used


def _source(config: LLMProcessorConfig) -> str:
    return f"processor '{config.name or config.type}'"


def resolve_message_format(config: LLMProcessorConfig) -> str:
    """``message_format``, else ``openai`` for a ``base_url`` or for a server launched from
    ``server_args.model_path`` (which fails here, with what to do, when no engine is installed)."""
    if config.message_format:
        return config.message_format
    if config.base_url:
        return "openai"
    source = _source(config)
    if _wants_server(config):
        find_engine(source, config.server_args)
        return "openai"
    raise ConfigError(
        source,
        "message_format",
        "say where the model runs: message_format (openai, anthropic, gemini or local) "
        "and model, or base_url of an OpenAI-compatible server",
    )


def check_named_key(config: LLMProcessorConfig) -> None:
    """The variable ``api_key_env`` names is set (a ConfigError naming the processor, the
    field and the variable otherwise); the key stays in the environment, read by llm_kit."""
    if config.api_key_env is not None:
        from llm_kit.hosts import host_of

        where = host_of(config.base_url) if config.base_url else resolve_message_format(config)
        key_from_named_variable(_source(config), "api_key_env", config.api_key_env, where)


def sampling_kwargs(config: LLMProcessorConfig) -> dict[str, Any]:
    """``default_sampling_params`` (SGLang names) as ``LLM(...)`` keyword arguments:
    ``max_new_tokens`` becomes ``max_tokens``; the others (and ``extra_body``'s) go through
    ``sampling=``."""
    params = flat_sampling(config.default_sampling_params)
    if "max_new_tokens" in params:
        if "max_tokens" in params and params["max_tokens"] != params["max_new_tokens"]:
            raise ConfigError(
                _source(config),
                "default_sampling_params",
                "max_new_tokens and max_tokens disagree; give only one of them",
            )
        params["max_tokens"] = params.pop("max_new_tokens")
    named = {k: params.pop(k) for k in _NAMED_SAMPLING if k in params}
    return {**named, "sampling": params or None}


def batch_config(config: LLMProcessorConfig) -> BatchConfig:
    from llm_kit import BatchConfig

    values = {f: getattr(config, f) for f in _PACING_FIELDS if getattr(config, f) is not None}
    # "record": one row's failure is that row's error, never the end of the batch.
    return BatchConfig(on_failure="record", **values)


def build_llm(config: LLMProcessorConfig, server: LaunchedServer | None = None) -> LLM:
    """The ``llm_kit.LLM`` for this config (aimed at ``server`` when one was launched for it);
    a missing API key fails here (llm_kit's sentence)."""
    from llm_kit import LLM

    message_format = resolve_message_format(config)
    check_named_key(config)
    model = config.model_name
    if model in ("", "none"):
        if message_format != "local":
            raise ConfigError(_source(config), "model", "name the model to call (model: ...)")
        model = _LOCAL_MODEL_NAME
    if message_format == "local" and config.local_threads is not None:
        from llm_kit.providers.local import set_local_threads

        set_local_threads(model, config.local_threads)
    return LLM(
        model=model,
        message_format=message_format,
        base_url=server.base_url if server else config.base_url,
        api_key=server.api_key if server else None,
        api_key_env=None if server else config.api_key_env,
        config=batch_config(config),
        structured_output=config.structured_output,
        **sampling_kwargs(config),
    )


class LLMProcessor(Processor):
    """One LLM for every output that names this processor; ``process`` runs a batch of rows
    concurrently (llm_kit's live pipeline: rate limits, retries, validation)."""

    def __init__(self, config: LLMProcessorConfig, context: RunContext | None = None) -> None:
        self.config = config
        self.server: LaunchedServer | None = None
        if _wants_server(config):
            # What is cheap to check fails before minutes of model loading, not after.
            sampling_kwargs(config)
            batch_config(config)
            # With the run's context, the server's log sits in the shard's state folder
            # (absolute: errors name it and the user may be elsewhere).
            log_dir = None
            if context is not None:
                log_dir = (Path(context.state_dir) / f"shard_{context.shard_id}").resolve()
            self.server = launch_server(config, log_dir)
        try:
            self.llm = build_llm(config, self.server)
        except BaseException:
            if self.server is not None:
                self.server.stop()
            raise
        # One connection pool for every group of rows of the shard, until aclose, and one
        # pool of requests over it for the groups in flight.
        self.llm.keep_open()
        self._requests = SharedStream(self.llm)
        # One pydantic model per (output, schema): building them is not free and rows are many.
        self._models: dict[tuple[str, Any], type[BaseModel]] = {}

    def _response_model(self, output: Any) -> type[BaseModel] | None:
        if not getattr(output, "is_json", False):
            return None
        key = (output.name, output.schema)
        model = self._models.get(key)
        if model is None:
            model = output.schema.pydantic_model(_model_name(output.name))
            self._models[key] = model
        return model

    @property
    def group_rows(self) -> int:
        """Rows per runner call: enough to keep every concurrent request slot busy."""
        return 4 * self.llm.config.worker_concurrency

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        results: list[OutputResult | None] = [None] * len(requests)
        await self.deliver(output, requests, results.__setitem__)
        return [r or OutputResult(error="no result came back for this row") for r in results]

    async def deliver(
        self,
        output: Any,
        requests: Sequence[OutputRequest],
        take: Callable[[int, OutputResult], None],
    ) -> None:
        """Each request's result to ``take`` the moment it arrives (the runner journals it)."""
        build = _ItemBuilder(output.name, self._response_model(output))
        items = build.items(RequestBatch.of(requests), take)
        # A rejected API key (401) raises from here: that is not one row's failure.
        await self._requests.run(items, _results_to(take))

    def request_stats(self) -> RequestStats:
        return self.llm.request_stats()

    async def drain(self) -> int:
        return await self._requests.drain()

    async def finish(self) -> str | None:
        await self._requests.stop()  # every group is done: the pool's workers can go
        return None

    async def aclose(self) -> None:
        try:
            await self._requests.cancel()
            await self.llm.aclose()
        finally:
            if self.server is not None:
                await asyncio.to_thread(self.server.stop)  # up to its grace period


def _model_name(output_name: str) -> str:
    return "".join(part.capitalize() for part in output_name.split("_")) or "Output"


class _ItemBuilder:
    """One output's requests as llm_kit items (llm_kit imported once per group, not per row)."""

    def __init__(self, output_name: str, response_model: type[BaseModel] | None) -> None:
        from llm_kit import BatchItem, Message
        from llm_kit.errors import ConfigError as ItemConfigError

        self.output_name = output_name
        self.response_model = response_model
        self.item_type = BatchItem
        self.user_message = Message.user
        self.item_error = ItemConfigError

    def items(
        self, requests: RequestBatch, take: Callable[[int, OutputResult], None]
    ) -> list[BatchItem]:
        """An item per request that can be sent; the others' errors go to ``take``. (One
        loop over the columns: rows are many.)"""
        item_type, user, model, name = (
            self.item_type,
            self.user_message,
            self.response_model,
            self.output_name,
        )
        empty = f"output '{name}': the rendered prompt is empty"
        all_urls = requests.image_urls or itertools.repeat(None)  # no image: None for each
        items: list[BatchItem] = []
        for index, (key, prompt, urls) in enumerate(
            zip(requests.row_keys, requests.prompts, all_urls, strict=False)
        ):
            if not prompt and not urls:
                take(index, OutputResult(error=empty))
                continue
            try:
                item = item_type(f"{key}:{name}", [user(prompt or "", image_urls=urls)], model)
            except self.item_error as exc:
                take(index, OutputResult(error=str(exc)))
                continue
            # The index maps results back even if two requests share a row key.
            item.metadata["index"] = index
            items.append(item)
        return items


def _results_to(take: Callable[[int, OutputResult], None]) -> Callable[[BatchResult], None]:
    """llm_kit's results to ``take``: a plain answer that ended normally in one call to its
    ``answer`` entry (the common case, by millions), any other (a failure, a JSON answer, a
    text cut at the token limit) as the ``OutputResult`` of ``_to_output_result``, which
    carries its finish reason and failure kind."""
    from llm_kit.answers import ORDINARY_STOPS

    answer = answer_of(take)

    def on_result(result: BatchResult) -> None:
        response, usage = result.response, result.usage
        if (
            result.ok
            and type(response) is str
            and usage is not None
            and result.finish_reason in ORDINARY_STOPS
        ):
            # Plain outputs are stripped, as the reference pipeline's outputs are.
            index = result.metadata["index"]
            answer(index, response.strip(), usage.input_tokens, usage.output_tokens)
        else:
            take(result.metadata["index"], _to_output_result(result))

    return on_result


def _to_output_result(result: Any) -> OutputResult:
    usage = result.usage
    if usage is None:
        out = OutputResult()
    else:
        out = OutputResult(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
    out.finish_reason = result.finish_reason
    if not result.ok:
        error = result.error or "the request failed"
        if result.error_kind and result.error_kind not in error:
            error = f"{error} ({result.error_kind})"
        # kind travels apart: the answer store keeps permanent failures (truncated,
        # validation) so that a rerun does not buy them again.
        out.error, out.retryable, out.kind = error, result.retryable, result.error_kind
    elif isinstance(result.response, str):
        # Plain outputs are stripped, as the reference pipeline's outputs are.
        out.value = result.response.strip()
    elif hasattr(result.response, "model_dump"):
        # JSON outputs: the validated answer as a dict keyed by the schema's own field names.
        out.value = result.response.model_dump(by_alias=True)
    else:
        out.value = str(result.response).strip()
    return out


__all__ = [
    "LLMProcessor",
    "build_llm",
    "check_named_key",
    "resolve_message_format",
    "sampling_kwargs",
]
