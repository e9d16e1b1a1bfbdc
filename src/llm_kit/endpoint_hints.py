"""What to do when an endpoint refuses every request: its error with one more clause.

A 401/403 says which environment variable holds the key and which host refused it (the run
stops: no item can succeed); a 404 on the request path says to check ``base_url`` (a server
reached without its ``/v1`` answers every request so).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from llm_kit.errors import ConfigError, ProviderError
from llm_kit.providers import provider_spec

KEY_REFUSED = frozenset({401, 403})  # statuses that end a run: the key, not one item
_ENDS_VERSIONED = re.compile(r"/v\d+\w*/?$")  # a base URL that ends in its API version
_STARTS_VERSIONED = re.compile(r"/v\d+\w*/")  # a request path that starts with it


def explained(
    error: ProviderError, provider: str, base_url: str, path: str, *, key_sent: bool
) -> ProviderError:
    """``error`` with what to do about it, for the statuses that have an answer; else as is."""
    if error.status in KEY_REFUSED:
        host = urlsplit(base_url).netloc or base_url
        names = " or ".join(_key_names(provider)) or "the API key"
        what = "check" if key_sent else "none was sent: set"
        hint = f"the API key was rejected by {host}: {what} {names} and run again"
    elif error.status == 404:
        url = base_url + path
        if _ENDS_VERSIONED.search(base_url) or _STARTS_VERSIONED.match(path):
            hint = f"nothing at {url}: check base_url and the model name"
        else:
            hint = f"nothing at {url}: check base_url (most servers want it to end in /v1)"
    else:
        return error
    return ProviderError(
        f"{error} - {hint}",
        status=error.status,
        kind=error.kind,
        retryable=error.retryable,
        retry_after=error.retry_after,
    )


def _key_names(provider: str) -> tuple[str, ...]:
    try:
        return provider_spec(provider).key_env
    except ConfigError:  # a codec registered under another name than its provider
        return ()


__all__ = ["KEY_REFUSED", "explained"]
