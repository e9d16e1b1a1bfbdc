"""One request inside the batching scheduler: its prompt, its answer so far, its end.

Its sampler (``sampling.SequenceSampler``) is its own, so that each sequence of a batch is held
by its own grammar, penalties and random state."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from llm_kit.types import Completion, Usage


@dataclass
class Request:
    """What the engine asks the scheduler for; ``future`` receives the Completion."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float | None
    seed: int
    repeat_penalty: float
    stops: list[str]
    grammar: Any = None  # a LlamaGrammar, or None for free text
    future: Future[Completion] = field(default_factory=Future)
    cancelled: threading.Event = field(default_factory=threading.Event)


class Sequence:
    """A request holding a slot: prompt tokens still to feed, tokens generated, the end."""

    def __init__(self, request: Request, slot: int, reused: int = 0) -> None:
        self.request = request
        self.slot = slot
        self.sampler: Any = None  # a SequenceSampler once the sequence starts
        self.fed = reused  # prompt tokens already in the slot's KV cells
        self.generated: list[int] = []
        self.next_token: int | None = None  # sampled, not yet decoded
        self.finish_reason: str | None = None
        self.text = ""
        self._bytes = b""  # the answer so far; decoded whole, since a piece may split a char

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.request.prompt)

    @property
    def decoding(self) -> bool:
        """Holds a sampled token that the next step decodes."""
        return not self.prefilling and self.next_token is not None

    @property
    def position(self) -> int:
        """The KV position of the next token this sequence decodes."""
        return self.fed + len(self.generated) - (1 if self.next_token is not None else 0)

    def take(self, token: int, model: Any) -> None:
        """A sampled token: the end of the answer, or one more token of it."""
        if model.is_end(token):
            self.finish_reason = "stop"
            return
        self.generated.append(token)
        self.next_token = token
        self._bytes += model.detokenize([token])
        text = self._bytes.decode("utf-8", errors="ignore")
        cut = [text.index(stop) for stop in self.request.stops if stop in text]
        if cut:
            self.text = text[: min(cut)]
            self.finish_reason = "stop"
        elif len(self.generated) >= self.request.max_tokens:
            self.text = text
            self.finish_reason = "length"
        else:
            self.text = text

    def completion(self) -> Completion:
        return Completion(
            text=self.text,
            usage=Usage(input_tokens=len(self.request.prompt), output_tokens=len(self.generated)),
            finish_reason=self.finish_reason,
        )
