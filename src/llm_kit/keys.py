"""Which key goes to which server.

An ``LLM`` sends ``api_key`` when given, else the value of ``api_key_env`` (a variable the
caller names: one key per endpoint), else the provider's own variable (``OPENAI_API_KEY``...).
The provider's own key still goes to another ``base_url`` when no variable is named (configs
written for one key keep working), and that is said once per variable and host: at INFO for a
server on this machine, as a WARNING for another host, with the way to send another key. The
key itself is kept in memory only: the transport's redactor knows it as an auth header value.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field

from llm_kit.errors import ConfigError, MissingAPIKeyError
from llm_kit.hosts import host_of, on_this_machine
from llm_kit.providers import ProviderSpec, require_key

logger = logging.getLogger(__name__)
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_said: set[tuple[str, str]] = set()  # (variable, host) pairs already logged in this process


def is_variable_name(name: str) -> bool:
    """Whether ``name`` can name an environment variable (letters, digits, ``_``; no digit
    first): what a field that names the variable holding a secret must be."""
    return _VARIABLE.fullmatch(name) is not None


@dataclass(frozen=True)
class KeyChoice:
    """The key to send (``None``: none) and the variables it is read from, which a refusal
    names; ``()`` when the caller passed the key itself."""

    value: str | None = field(repr=False)  # never in a repr, a log or a traceback's locals
    variables: tuple[str, ...] = ()
    providers_own: bool = False  # read from the provider's variable, not one the caller named


NO_KEY = KeyChoice(None, ())


def choose_key(
    spec: ProviderSpec, api_key: str | None, api_key_env: str | None, base_url: str | None
) -> KeyChoice:
    """The key for requests to ``base_url`` (``None``: the provider's own URL).

    Raises:
        ConfigError: ``api_key_env`` is no variable name.
        MissingAPIKeyError: the variable ``api_key_env`` names is unset or empty, or no key at
            all for the provider's own URL.
    """
    if api_key:
        return KeyChoice(api_key, ())
    if api_key_env is not None:
        if not is_variable_name(api_key_env):
            # Not quoted: a key pasted where its variable's name belongs must not be shown.
            raise ConfigError("api_key_env must name an environment variable, not hold the key")
        value = os.environ.get(api_key_env)
        if not value:
            raise MissingAPIKeyError(
                f"no API key for {spec.name}: {api_key_env} (named by api_key_env) is not set "
                f"in the environment (export {api_key_env}=…)"
            )
        return KeyChoice(value, (api_key_env,))
    found = next((name for name in spec.key_env if os.environ.get(name)), None)
    if found is not None:
        return KeyChoice(os.environ[found], (found,), providers_own=True)
    if base_url is None:  # the provider's own URL wants a key; another server may not
        require_key(spec.name)
    return KeyChoice(None, spec.key_env, providers_own=True)


def key_for(
    spec: ProviderSpec, api_key: str | None, api_key_env: str | None, base_url: str | None
) -> KeyChoice:
    """``choose_key``, and a word when the provider's own key leaves for another host."""
    choice = choose_key(spec, api_key, api_key_env, base_url)
    destination = base_url or spec.default_base_url
    if destination:
        say_where_it_goes(choice, spec, destination)
    return choice


def say_where_it_goes(choice: KeyChoice, spec: ProviderSpec, base_url: str) -> None:
    """Log once which variable's key goes to ``base_url`` when it is the provider's own key
    and ``base_url`` is not the provider's own host."""
    home = spec.codec.default_base_url if spec.codec else None
    if choice.value is None or not choice.providers_own or home is None:
        return
    variable, host = choice.variables[0], host_of(base_url)
    if host == host_of(home) or (variable, host) in _said:
        return
    _said.add((variable, host))
    local = on_this_machine(base_url)
    logger.log(
        logging.INFO if local else logging.WARNING,
        "the key in %s (%s's) goes to %s%s; to send that server its own key, name the "
        "variable that holds it with api_key_env",
        variable,
        spec.name,
        host,
        "" if local else f", which is not {spec.name}'s own host",
    )


__all__ = [
    "NO_KEY",
    "KeyChoice",
    "choose_key",
    "is_variable_name",
    "key_for",
    "say_where_it_goes",
]
