"""``message_format="local"``: the embedded llama.cpp model, in this process, no key, no HTTP."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llm_kit.errors import ConfigError
from llm_kit.providers.base import Backend
from llm_kit.providers.registry import ProviderSpec, register_provider
from llm_kit.schema import ResponseSchema
from llm_kit.types import BatchConfig, Completion, Message

# llama.cpp's word for an answer stopped by max_tokens (as OpenAI's).
CUT_REASONS = frozenset({"length"})


class LocalBackend(Backend):
    """The embedded llama.cpp model. Text only: image parts are dropped (it cannot see)."""

    def __init__(self, model_path: str | None = None, slots: int | None = None) -> None:
        from llm_kit.local import LocalEngine  # deferred, like default_model_path below

        self.engine = LocalEngine.shared(model_path, slots=slots)

    async def complete(
        self,
        messages: Sequence[Message],
        sampling: Mapping[str, Any],
        schema: ResponseSchema | None,
    ) -> Completion:
        max_tokens = sampling.get("max_tokens") or sampling.get("max_completion_tokens")
        stop = sampling.get("stop")
        completion = await self.engine.complete(
            messages,
            max_tokens=max_tokens,
            temperature=sampling.get("temperature"),
            top_p=sampling.get("top_p"),
            seed=sampling.get("seed"),
            stop=[stop] if isinstance(stop, str) else stop,
            json_schema=schema.schema if schema is not None else None,
        )
        completion.cut = completion.finish_reason in CUT_REASONS
        return completion


def local_model_path(model: str) -> str:
    """The GGUF file: ``model`` when it is a .gguf path, else the embedded default. Checked
    when the LLM is built, so that a missing install fails before any item runs."""
    # deferred: only a local LLM needs the engine
    from llm_kit.local.model_file import INSTALL, default_model_path, ensure_model_file

    if importlib.util.find_spec("llama_cpp") is None:
        raise ConfigError(
            f"the local model needs {INSTALL} (the package llama-cpp-python is not installed)"
        )
    path = Path(model).expanduser() if model.endswith(".gguf") else default_model_path()
    path = ensure_model_file(path)  # the default model is fetched once, before any item runs
    if not path.is_file():
        raise ConfigError(
            f"local model file {path} does not exist; pass model='path/to/model.gguf' or set "
            "LLM_KIT_LOCAL_MODEL_PATH"
        )
    return str(path)


def set_local_threads(model: str, n_threads: int) -> None:
    """The threads the embedded model decodes with, if it is not loaded yet (one per process)."""
    from llm_kit.local import LocalEngine  # deferred: only a local LLM needs the engine

    LocalEngine.shared(local_model_path(model), n_threads=n_threads)


def batch_slots(config: BatchConfig) -> int | None:
    """Requests the engine decodes together: ``worker_concurrency`` when the caller set it,
    else None (the engine's measured default; llm_kit's 64 is sized for HTTP providers)."""
    if "worker_concurrency" in config.model_fields_set:
        return config.worker_concurrency
    return None


def _prepare(model: str, config: BatchConfig) -> Callable[[], Backend]:
    path = local_model_path(model)
    slots = batch_slots(config)
    return lambda: LocalBackend(path, slots)


LOCAL = register_provider(ProviderSpec(name="local", in_process=_prepare))
