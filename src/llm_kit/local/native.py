"""The loaded llama.cpp model and its one context, holding a KV cache for every slot.

llama-cpp-python's high-level ``Llama`` object decodes one sequence at a time; the batching
scheduler needs the low-level API instead: one context with ``n_seq_max`` sequences (one per
slot), each with its own stretch of the KV cache (``kv_unified`` off, so that a sequence's
attention spans only its own tokens). The chat template and tokenisation are the ones
``Llama.create_chat_completion`` uses, so the prompt tokens are the same as before.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

from llm_kit.errors import ConfigError, ItemError
from llm_kit.local.candidates import Candidates

_backend_lock = threading.Lock()
_backend_ready = False


def _init_backend(llama_cpp: Any) -> None:
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True


class NativeModel:
    """A GGUF model, its context (``slots`` sequences of ``n_ctx`` tokens) and one batch."""

    def __init__(
        self,
        llama_cpp: Any,
        path: Path,
        *,
        slots: int,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
    ) -> None:
        from llama_cpp import _internals, llama_chat_format  # loaded with llama_cpp itself
        from llama_cpp._logger import set_verbose

        set_verbose(False)  # llama.cpp otherwise floods stderr with load logs

        self.api = llama_cpp
        self._internals = _internals
        self.slots = slots
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        _init_backend(llama_cpp)
        try:
            self.model = _internals.LlamaModel(
                path_model=str(path), params=llama_cpp.llama_model_default_params(), verbose=False
            )
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"llama.cpp could not load {path} ({exc}); point LLM_KIT_LOCAL_MODEL_PATH at a "
                "valid GGUF chat model"
            ) from None
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = n_ctx * slots
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = slots
        params.kv_unified = False
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        # As llama-server: flash attention where the backend has it (on the CPU it does); without
        # it every step builds full attention matrices, measured 1.4x slower at 8 sequences.
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        try:
            self.context = _internals.LlamaContext(model=self.model, params=params, verbose=False)
        except ValueError as exc:
            self.model.close()
            raise ConfigError(
                f"llama.cpp could not make a context of {slots} slot(s) x {n_ctx} tokens "
                f"({exc}); lower worker_concurrency"
            ) from None
        self.vocab = self.model.vocab
        self.n_vocab = self.model.n_vocab()
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self.candidates = Candidates(llama_cpp, self.n_vocab)
        self._format = self._chat_formatter(llama_chat_format)

    def _chat_formatter(self, llama_chat_format: Any) -> Any:
        """The GGUF's own chat template, as ``Llama`` builds it (ChatML when it has none)."""
        template = self.model.metadata().get("tokenizer.chat_template")
        eos = self.model.token_eos()
        bos = self.model.token_bos()
        if template is None:
            return llama_chat_format.format_chatml
        return llama_chat_format.Jinja2ChatFormatter(
            template=template,
            eos_token=self.model.token_get_text(eos) if eos != -1 else "",
            bos_token=self.model.token_get_text(bos) if bos != -1 else "",
            stop_token_ids=[eos],
        )

    def chat_prompt(self, chat: list[dict[str, str]]) -> tuple[list[int], list[str]]:
        """The prompt tokens and the template's stop strings for a chat."""
        result = self._format(messages=chat)
        tokens = self.model.tokenize(
            result.prompt.encode("utf-8"), add_bos=not result.added_special, special=True
        )
        stops = result.stop if isinstance(result.stop, list) else [result.stop]
        return tokens, [stop for stop in stops if stop]

    def detokenize(self, tokens: list[int]) -> bytes:
        return bytes(self.model.detokenize(tokens))

    def is_end(self, token: int) -> bool:
        return bool(self.api.llama_vocab_is_eog(self.vocab, token))

    def new_sampler(self) -> Any:
        return self._internals.LlamaSampler()

    def new_grammar(self, grammar: Any) -> Any:
        """A native grammar sampler for a GBNF grammar (llama.cpp gives NULL for one it cannot
        parse); the caller frees it."""
        native = self.api.llama_sampler_init_grammar(
            self.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        if not native:
            raise ItemError("the local model cannot follow this JSON schema; simplify it")
        return native

    def sample(self, sampler: Any, index: int) -> int:
        """Sample from the logits of batch row ``index``; the chain accepts the token."""
        return int(self.api.llama_sampler_sample(sampler.sampler, self.context.ctx, index))

    def logits(self, index: int) -> Any:
        """The logits of batch row ``index`` (a float pointer, valid until the next decode)."""
        return self.api.llama_get_logits_ith(self.context.ctx, index)

    # -- the batch ------------------------------------------------------------------------

    def batch_fill(self, rows: list[tuple[int, int, int, bool]]) -> None:
        """Put (token, position, sequence, wants logits) rows into the batch."""
        batch = self.batch
        for i, (token, pos, seq, logits) in enumerate(rows):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = logits
        batch.n_tokens = len(rows)

    def decode(self) -> int:
        """llama_decode on the batch: 0 on success, llama.cpp's code otherwise."""
        return int(self.api.llama_decode(self.context.ctx, self.batch))

    def graphs_reused(self) -> int:
        """How many decodes reused the previous compute graph (llama.cpp's own count)."""
        return int(self.api.llama_perf_context(self.context.ctx).n_reused)

    def forget(self, seq: int, start: int = 0) -> None:
        """Free a sequence's KV cells from position ``start`` on (all of them by default)."""
        self.api.llama_memory_seq_rm(self.context.memory, seq, start if start > 0 else -1, -1)

    def set_threads(self, n_threads: int) -> None:
        self.api.llama_set_n_threads(self.context.ctx, n_threads, n_threads)

    def close(self) -> None:
        if self.batch is not None:
            self.api.llama_batch_free(self.batch)
            self.batch = None
        self.context.close()
        self.model.close()

    def kv_bytes_per_token(self) -> int:
        """Bytes one token takes in the KV cache (keys and values, every layer, f16)."""
        api, model = self.api, self.model.model
        head_dim = api.llama_model_n_embd(model) // api.llama_model_n_head(model)
        kv_width = api.llama_model_n_head_kv(model) * head_dim
        return int(api.llama_model_n_layer(model) * kv_width * 2 * ctypes.sizeof(ctypes.c_uint16))
