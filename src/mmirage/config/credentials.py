"""Where credentials come from: the environment only, never the YAML."""

from __future__ import annotations

import re
from typing import Any

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
