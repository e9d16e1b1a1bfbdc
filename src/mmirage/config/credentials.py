"""Where credentials come from: the environment only, never the YAML."""

from __future__ import annotations

import os
import re
from typing import Any

from llm_kit.keys import is_variable_name
from mmirage.config.errors import ConfigError, FieldError

# A key pasted where its variable's name belongs, though it could be a name: a provider's key
# prefix and its random tail (Google, Hugging Face, Groq, GitHub, GitLab, Stripe-like), a run
# of 32+ letters and digits that mixes upper case, lower case and digits, or 32+ hex digits.
# Words joined by ``_`` (litellm_proxy_key_2024_prod) are a name, however long.
_LOOKS_LIKE_A_KEY = re.compile(
    r"^(?:AIza[0-9A-Za-z_-]{30,}|(?:hf|gsk|ghp|gho|ghs|ghu|glpat)_[A-Za-z0-9]{20,}"
    r"|github_pat_\w{40,}|[sr]k_(?:live|test)_[A-Za-z0-9]{20,})$"
    r"|(?=[A-Za-z0-9]*[a-z])(?=[A-Za-z0-9]*[A-Z])(?=[A-Za-z0-9]*[0-9])[A-Za-z0-9]{32,}"
    r"|[0-9a-f]{32,}"
)
# Keys a user may write in the YAML hoping to pass a secret: refused, naming the variable to set.
_SECRET_KEYS = frozenset(
    {"api_key", "apikey", "key", "token", "secret", "password", "access_token"}
)


def credential_env_var(provider: str, key: str) -> str:
    """``("azure-openai", "api_key")`` → ``AZURE_OPENAI_API_KEY`` (the spec's naming rule)."""
    return re.sub(r"[^A-Za-z0-9]", "_", f"{provider}_{key}").upper()


def secret_key_problem(key: str, raw: dict[str, Any]) -> str | None:
    """The sentence for a secret written into a processor's YAML, or None for any other key."""
    if key.lower() not in _SECRET_KEYS:
        return None
    provider = raw.get("provider") or raw.get("message_format") or "openai"
    variable = credential_env_var(str(provider), "api_key")
    return (
        f"'{key}' cannot be set in the config: keys come only from the environment, "
        f"so remove it and run `export {variable}=…`"
    )


def check_variable_name(field: str, name: str, message_format: str | None) -> None:
    """``field`` names an environment variable, for a provider that takes a key."""
    if not is_variable_name(name) or _LOOKS_LIKE_A_KEY.search(name):
        # Never quoted: it may be the key itself.
        raise FieldError(
            field,
            "must be the name of an environment variable (letters, digits, _), not the key: "
            "export the key in a variable and name that variable here",
        )
    if message_format == "local":
        raise FieldError(field, "message_format local (the embedded model) needs no key; remove it")


def key_from_named_variable(source: str, field: str, variable: str, where: str) -> str:
    """The key in ``variable``, which ``field`` of ``source`` names, for requests to ``where``;
    a ConfigError naming all three when it is unset or empty."""
    key = os.environ.get(variable)
    if not key:
        raise ConfigError(
            source,
            field,
            f"{variable} is not set in the environment; "
            f"run `export {variable}=…` with the key for {where}",
        )
    return key
