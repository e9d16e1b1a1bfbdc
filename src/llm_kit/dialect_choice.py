"""Which structured-output dialect a model behind a server gets, learned from the server's
refusals and from its first answers, and remembered per (base URL, model) for the life of the
process: every client and request aimed at that model moves on together, while the other
models of the same URL (a gateway such as LiteLLM routes each to its own backend) keep theirs.

Real servers mostly ignore a field they do not know and answer HTTP 200, so a refusal is not
the only sign: while no answer in a dialect has fit the schema yet, ``PROBATION`` answers that
do not (prose, or JSON that misses it) show that the server ignored the dialect: every dialect
but the last, ``prompt``, carries the schema, and a server that follows one sends nothing but
JSON of that schema (``json_object`` counts: the servers that take it with the schema enforce
it, and one that gives JSON mode alone is better served by the prompt form, which states the
schema). The requests of those answers go again at once, without spending a validation retry,
and ``auto`` moves on; a dialect the caller named ends every item with one
``DialectIgnoredError`` instead of paying for validation retries on each. Only an answer that
fits makes a dialect trusted; under ``prompt`` a miss is the model's, for validation retries.
"""

from __future__ import annotations

import logging

from llm_kit.dialects import DIALECTS, Dialect
from llm_kit.errors import ConfigError, DialectIgnoredError
from llm_kit.providers.registry import provider_spec
from llm_kit.redact import redact_text

logger = logging.getLogger(__name__)

# First answers of a dialect that, none of them fitting the schema, show that the server
# ignored it. Three: one may be a slip (a prose answer); three in a row, none fitting, are not.
PROBATION = 3


class DialectChoice:
    """The dialect in use for one model at one server, and what to try when the server
    refuses or ignores it. Touched only from the event loop, between awaits: no lock."""

    def __init__(self, base_url: str, model: str, chain: tuple[Dialect, ...], named: bool) -> None:
        self.base_url = base_url
        self.model = model
        # For the log: a URL may carry ?key=...
        self._where = f"{model} at {redact_text(base_url)}"
        self._chain = chain
        self._named = named
        self._index = 0
        self._misses = 0  # answers in the current dialect that missed the schema, untrusted
        self._trusted = False  # an answer in the current dialect fit: the server follows it
        self._ignored: str | None = None  # why the named dialect cannot be used, once known

    @property
    def current(self) -> Dialect:
        return self._chain[self._index]

    def in_use(self) -> Dialect:
        """The dialect to send; DialectIgnoredError once the named one proved ignored."""
        if self._ignored is not None:
            raise DialectIgnoredError(self._ignored)
        return self.current

    def moved_on(self, dialect: Dialect, status: int, error_body: bytes) -> bool:
        """Whether a request refused in ``dialect`` should go again at once in ``current``
        (a refused dialect is not a failure of the item: no retry is spent on it)."""
        if not dialect.refused(status, error_body):
            return False
        position = self._chain.index(dialect)
        if position < self._index:  # a concurrent request already moved everyone on
            return True
        if position + 1 >= len(self._chain):
            return False
        self._step(f"refused structured output as {dialect.name} (HTTP {status})")
        return True

    def judges(self, dialect: Dialect) -> bool:
        """Whether an answer in ``dialect`` is still evidence (``judged``): until one in the
        current dialect fits the schema, and for those of a dialect given up meanwhile."""
        return dialect is not self.current or not self._trusted

    def judged(self, dialect: Dialect, fits: bool) -> bool:
        """Told whether an answer in ``dialect`` fit the schema; whether its request should go
        again at once, as it was, in ``current``: no validation retry is spent on an answer
        that shows the dialect, not the model, to be at fault.

        Raises DialectIgnoredError when the caller's named dialect proved ignored.
        """
        position = self._chain.index(dialect)
        if position < self._index:  # given up meanwhile: a miss goes again in the newer one
            return not fits
        if fits:
            if not self._trusted:
                self._trusted = True
                logger.info("structured output for %s: %s", self._where, dialect.name)
            return False
        if self._trusted or not dialect.fields:  # the model's slip (nothing a server ignores)
            return False
        if self._ignored is not None:
            raise DialectIgnoredError(self._ignored)
        self._misses += 1
        if self._misses < PROBATION:
            return True  # on probation: the same request again, to tell model from server
        if position + 1 < len(self._chain):
            self._step(
                f"ignored structured output as {dialect.name} (HTTP 200, but its first "
                f"{PROBATION} answers did not fit the schema)"
            )
            return True
        if not self._named:  # the end of auto's list: the model is judged as usual
            return False
        self._ignored = (
            f"the server ignores structured_output {dialect.name!r} for {self._where}: it "
            f"answered HTTP 200, but its first {PROBATION} answers did not fit the schema; set "
            "structured_output to auto, or to a form this server takes"
        )
        logger.warning("%s", self._ignored)
        raise DialectIgnoredError(self._ignored)

    def _step(self, why: str) -> None:
        self._index += 1
        self._misses, self._trusted = 0, False
        logger.info("%s %s; trying %s", self._where, why, self.current.name)


_CHOICES: dict[tuple[str, str, str], DialectChoice] = {}


def dialect_choice(base_url: str, model: str, structured_output: str) -> DialectChoice:
    """The process-wide choice for ``model`` at ``base_url``: every dialect in order for
    ``auto``, else only the one named."""
    key = (base_url.rstrip("/"), model, structured_output)
    choice = _CHOICES.get(key)
    if choice is None:
        named = structured_output != "auto"
        chain = (_dialect(structured_output),) if named else tuple(DIALECTS.values())
        choice = _CHOICES[key] = DialectChoice(key[0], model, chain, named)
    return choice


def _dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]
    except KeyError:
        raise ConfigError(
            f"unknown structured_output {name!r}; use one of: auto, {', '.join(DIALECTS)}"
        ) from None


def check_structured_output(name: str, message_format: str) -> str:
    """``name`` when it is legal for ``message_format``, else ConfigError saying what is."""
    if name != "auto":
        _dialect(name)
        if not provider_spec(message_format).speaks_dialects:
            raise ConfigError(
                f"structured_output={name!r} is for OpenAI-compatible servers "
                f"(message_format='openai'); {message_format} has one native form: leave it "
                "'auto'"
            )
    return name


__all__ = ["DialectChoice", "check_structured_output", "dialect_choice"]
