"""Choosing one sequence's next token: its own sampler chain, its JSON grammar checked first.

The chain is the one ``Llama.create_chat_completion`` builds (repeat penalty over the last 64
tokens, then greedy or top-k/typical/top-p/min-p/temperature with the request's seed), one chain
per request, so that each sequence of a batch keeps its own penalties and random state.

At temperature 0 the pick is computed here with numpy, bit for bit what the chain would pick
(``greedy_token``; a test holds the two side by side): the chain's penalty looks up each of the
vocabulary's 49,152 tokens in its window at every step (0.18 ms a token, 4% of a run), this
touches only the recent tokens, and such a request has no chain at all: its window of recent
tokens is kept here, and a grammar's full pass below ends in the same numpy pick.

A JSON grammar applied to every candidate token costs about 5 ms per token on SmolLM2's
vocabulary, as much as the decode step itself (measured: half of a JSON run's time). So, as
llama-server does, the first pick is made without the grammar, and only when the grammar
refuses that one token is it applied to every candidate and the chain run again. At
temperature 0 the answer is the same token for token: the best token is also the best the
grammar allows whenever the grammar allows it. A sampled answer draws from the chain's own
picks where the grammar allows them, as llama-server's does, and still repeats with its seed.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from llm_kit.local.sequence import Request

PENALTY_LAST_N = 64  # llama-cpp-python's default window for the repeat penalty
_TOP_K, _MIN_P, _TYPICAL_P, _DEFAULT_TOP_P = 40, 0.05, 1.0, 0.95


class SequenceSampler:
    """One request's picker (numpy at temperature 0, else its llama.cpp chain), and its
    grammar (a native llama.cpp sampler) when it has one."""

    def __init__(self, model: Any, request: Request) -> None:
        self._model = model
        self._api = model.api
        self._penalty = request.repeat_penalty
        # At temperature 0 the window is kept here and no chain is built; else the chain
        # keeps its own.
        self._recent: deque[int] | None = None
        self.chain: Any = None
        if request.temperature == 0.0:
            self._recent = deque(maxlen=PENALTY_LAST_N)
        else:
            self.chain = _build_chain(model, request)
        self.grammar = None
        self.full_passes = 0  # tokens the grammar refused, so that it filtered every candidate
        if request.grammar is not None:
            try:
                self.grammar = model.new_grammar(request.grammar)
            except Exception:
                self.close()
                raise

    def sample(self, row: int) -> int:
        """The next token from batch row ``row``; the window (and grammar) take it in."""
        if self.grammar is None and self.chain is not None:
            return self._model.sample(self.chain, row)  # llama.cpp samples and accepts
        api, candidates = self._api, self._model.candidates
        logits = self._model.logits(row)
        if self._recent is not None:
            values = np.ctypeslib.as_array(logits, shape=(self._model.n_vocab,))
            token = greedy_token(values, self._recent, self._penalty)
        else:
            token = self._chain_pick(candidates.fill(logits))
        if self.grammar is not None:
            api.llama_sampler_apply(self.grammar, candidates.one(token))
            if candidates.one_refused():
                self.full_passes += 1
                cur = candidates.fill(logits)
                api.llama_sampler_apply(self.grammar, cur)  # refused tokens become -inf
                if self._recent is not None:
                    token = greedy_token(candidates.logits(), self._recent, self._penalty)
                else:
                    token = self._chain_pick(cur)
            api.llama_sampler_accept(self.grammar, token)
        if self._recent is not None:
            self._recent.append(token)
        else:
            api.llama_sampler_accept(self.chain.sampler, token)
        return token

    def _chain_pick(self, cur: Any) -> int:
        self._api.llama_sampler_apply(self.chain.sampler, cur)
        return self._model.candidates.selected()

    def close(self) -> None:
        if self.chain is not None:
            self.chain.close()
        if self.grammar is not None:
            self._api.llama_sampler_free(self.grammar)
            self.grammar = None


def greedy_token(logits: np.ndarray, recent: Any, penalty: float) -> int:
    """What llama.cpp's repeat penalty then greedy choose, bit for bit: each token seen among
    ``recent`` has its logit divided by ``penalty`` (multiplied when not above zero), in
    float32, and the first of the highest logits wins."""
    seen = np.fromiter(set(recent), dtype=np.int64)
    if penalty == 1.0 or not len(seen):
        return int(np.argmax(logits))
    values = logits.copy()  # llama.cpp's buffer stays as it is
    factor = np.float32(penalty)
    picked = values[seen]
    values[seen] = np.where(picked <= 0, picked * factor, picked / factor)
    return int(np.argmax(values))


def _build_chain(model: Any, request: Request) -> Any:
    """A sampled request's chain without its grammar, in ``Llama._init_sampler``'s order."""
    sampler = model.new_sampler()
    sampler.add_penalties(
        n_vocab=model.n_vocab,
        penalty_last_n=PENALTY_LAST_N,
        penalty_repeat=request.repeat_penalty,
        penalty_freq=0.0,
        penalty_present=0.0,
    )
    top_p = _DEFAULT_TOP_P if request.top_p is None else request.top_p
    sampler.add_top_k(_TOP_K)
    sampler.add_typical(_TYPICAL_P, 1)
    sampler.add_top_p(top_p, 1)
    sampler.add_min_p(_MIN_P, 1)
    sampler.add_temp(request.temperature)
    sampler.add_dist(request.seed)
    return sampler
