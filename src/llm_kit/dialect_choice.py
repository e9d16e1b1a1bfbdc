"""Which structured-output dialect a server gets, learned from its refusals and remembered per
base URL for the life of the process, so that every client and request aimed at one server
moves on together after the first refusal."""

from __future__ import annotations

import logging

from llm_kit.dialects import DIALECTS, Dialect
from llm_kit.errors import ConfigError
from llm_kit.providers.registry import provider_spec
from llm_kit.redact import redact_text

logger = logging.getLogger(__name__)


class DialectChoice:
    """The dialect in use for one server, and what to try when the server refuses it."""

    def __init__(self, base_url: str, chain: tuple[Dialect, ...]) -> None:
        self.base_url = base_url
        self._where = redact_text(base_url)  # for the log: a URL may carry ?key=…
        self._chain = chain
        self._index = 0
        self._announced = False

    @property
    def current(self) -> Dialect:
        return self._chain[self._index]

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
        self._index = position + 1
        logger.info(
            "%s refused structured output as %s (HTTP %d); trying %s",
            self._where,
            dialect.name,
            status,
            self.current.name,
        )
        return True

    def worked(self, dialect: Dialect) -> None:
        """Say once which dialect this server answers."""
        if not self._announced:
            self._announced = True
            logger.info("structured output for %s: %s", self._where, dialect.name)


_CHOICES: dict[tuple[str, str], DialectChoice] = {}


def dialect_choice(base_url: str, structured_output: str) -> DialectChoice:
    """The process-wide choice for ``base_url``: every dialect in order for ``auto``, else
    only the one named."""
    key = (base_url.rstrip("/"), structured_output)
    choice = _CHOICES.get(key)
    if choice is None:
        chain = (
            tuple(DIALECTS.values())
            if structured_output == "auto"
            else (_dialect(structured_output),)
        )
        choice = _CHOICES[key] = DialectChoice(key[0], chain)
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
