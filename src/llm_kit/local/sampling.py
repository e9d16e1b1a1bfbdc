"""Choosing one sequence's next token: its own sampler chain, its JSON grammar checked first.

The chain is the one ``Llama.create_chat_completion`` builds (repeat penalty over the last 64
tokens, then greedy or top-k/typical/top-p/min-p/temperature with the request's seed), one chain
per request, so that each sequence of a batch keeps its own penalties and random state.

A JSON grammar applied to every candidate token costs about 5 ms per token on SmolLM2's 49,152
tokens, as much as the decode step itself (measured: half of a JSON run's time). So, as
llama-server does, the chain first picks a token without the grammar, and only when the grammar
refuses that one token is it applied to every candidate and the chain run again. At temperature
0 the answer is the same token for token: the best token is also the best the grammar allows
whenever the grammar allows it. A sampled answer draws from the chain's own picks where the
grammar allows them, as llama-server's does, and still repeats with its seed.
"""

from __future__ import annotations

from typing import Any

from llm_kit.local.sequence import Request

PENALTY_LAST_N = 64  # llama-cpp-python's default window for the repeat penalty
_TOP_K, _MIN_P, _TYPICAL_P, _DEFAULT_TOP_P = 40, 0.05, 1.0, 0.95


class SequenceSampler:
    """One request's chain, and its grammar (a native llama.cpp sampler) when it has one."""

    def __init__(self, model: Any, request: Request) -> None:
        self._model = model
        self._api = model.api
        self.chain = _build_chain(model, request)
        self.grammar = None
        self.full_passes = 0  # tokens the grammar refused, so that it filtered every candidate
        if request.grammar is not None:
            try:
                self.grammar = model.new_grammar(request.grammar)
            except Exception:
                self.chain.close()
                raise

    def sample(self, row: int) -> int:
        """The next token from batch row ``row``; the chain (and grammar) accept it."""
        if self.grammar is None:
            return self._model.sample(self.chain, row)
        api, chain = self._api, self.chain.sampler
        candidates = self._model.candidates
        logits = self._model.logits(row)
        api.llama_sampler_apply(chain, candidates.fill(logits))
        token = candidates.selected()
        api.llama_sampler_apply(self.grammar, candidates.one(token))
        if candidates.one_refused():
            self.full_passes += 1
            cur = candidates.fill(logits)
            api.llama_sampler_apply(self.grammar, cur)
            api.llama_sampler_apply(chain, cur)
            token = candidates.selected()
        api.llama_sampler_accept(chain, token)
        api.llama_sampler_accept(self.grammar, token)
        return token

    def close(self) -> None:
        self.chain.close()
        if self.grammar is not None:
            self._api.llama_sampler_free(self.grammar)
            self.grammar = None


def _build_chain(model: Any, request: Request) -> Any:
    """The request's chain without its grammar, in ``Llama._init_sampler``'s order."""
    sampler = model.new_sampler()
    sampler.add_penalties(
        n_vocab=model.n_vocab,
        penalty_last_n=PENALTY_LAST_N,
        penalty_repeat=request.repeat_penalty,
        penalty_freq=0.0,
        penalty_present=0.0,
    )
    if request.temperature == 0.0:
        sampler.add_greedy()
    else:
        top_p = _DEFAULT_TOP_P if request.top_p is None else request.top_p
        sampler.add_top_k(_TOP_K)
        sampler.add_typical(_TYPICAL_P, 1)
        sampler.add_top_p(top_p, 1)
        sampler.add_min_p(_MIN_P, 1)
        sampler.add_temp(request.temperature)
        sampler.add_dist(request.seed)
    return sampler
