"""Every token of the vocabulary with its logit, as llama.cpp's samplers take them.

``llama_sampler_sample`` builds this array inside llama.cpp; a sampler that must look at a token
before choosing how to sample (``sampling.SequenceSampler``: a grammar asked about one token
first) builds it here instead, with numpy's whole-array copies rather than a Python loop.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

# llama.cpp's llama_token_data, as a numpy record, so that a whole vocabulary is filled at once.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class Candidates:
    """Every token of the vocabulary with its logit, in one buffer that llama.cpp's samplers
    read and reorder in place (one per model: sampling runs on the decode thread only)."""

    def __init__(self, api: Any, n_vocab: int) -> None:
        self._api = api
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        pointer = self._data.ctypes.data_as(ctypes.POINTER(api.llama_token_data))
        self.array = api.llama_token_data_array(data=pointer, size=n_vocab)
        self._one = api.llama_token_data()
        self._one_array = api.llama_token_data_array(data=ctypes.pointer(self._one), size=1)

    def fill(self, logits: Any) -> Any:
        """The candidates from a row's logits (a float pointer), ready for a sampler."""
        n_vocab = len(self._ids)
        self._data["id"] = self._ids
        self._data["logit"] = np.ctypeslib.as_array(logits, shape=(n_vocab,))
        self._data["p"] = 0.0
        self.array.size, self.array.selected, self.array.sorted = n_vocab, -1, False
        return ctypes.byref(self.array)

    def logits(self) -> np.ndarray:
        """The logits as a sampler left them (a grammar writes -inf in place, in token order)."""
        return self._data["logit"]

    def selected(self) -> int:
        """The token the last sampler chose (as ``llama_sampler_sample``, refuse no choice)."""
        index = self.array.selected
        if not 0 <= index < self.array.size:
            raise RuntimeError(f"the sampler chose no token (index {index})")
        return int(self._data["id"][index])

    def one(self, token: int) -> Any:
        """A single candidate, to ask a grammar about that token alone."""
        self._one.id, self._one.logit, self._one.p = token, 0.0, 0.0
        self._one_array.size, self._one_array.selected, self._one_array.sorted = 1, -1, False
        return ctypes.byref(self._one_array)

    def one_refused(self) -> bool:
        return math.isinf(self._one.logit)
