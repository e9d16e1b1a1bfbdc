"""What to do when an endpoint refuses every request: its error with one more clause.

A refusal of the key says which environment variable holds the key and which host refused it
(the run stops: no item can succeed). That is a 401/403, or a gateway's answer about its key
in another status: a LiteLLM proxy answers HTTP 500 in plain text without a key and HTTP 400
"No connected db." with a key it does not know (when it has no database). Those are never
retried. A 404 on the request path says to check ``base_url`` (a server reached without its
``/v1`` answers every request so).
"""

from __future__ import annotations

import re

from llm_kit.errors import KeyRefusedError, ProviderError
from llm_kit.hosts import host_of

KEY_REFUSED = frozenset({401, 403})  # statuses that end a run: the key, not one item
# Statuses in which gateways answer about a key (LiteLLM: 400 and 500); never a 404 or 429.
_GATEWAY_KEY_STATUSES = frozenset({400, 500})
# What a gateway's answer about the key says (matched in the error's text, case aside).
_ABOUT_THE_KEY = re.compile(
    r"\bno api[ _-]?key\b|\bapi[ _-]?key\b[^.]{0,40}\b(?:missing|required|invalid|incorrect|not "
    r"(?:passed|provided|valid|found))\b|\b(?:invalid|incorrect|missing|wrong|bad) api[ _-]?key\b"
    r"|\bno connected db\b|\bauthentication error\b|\bauth_error\b|\bunauthori[sz]ed\b"
    r"|\bmaster[ _-]?key\b",
    re.IGNORECASE,
)
_ENDS_VERSIONED = re.compile(r"/v\d+\w*/?$")  # a base URL that ends in its API version
_STARTS_VERSIONED = re.compile(r"/v\d+\w*/")  # a request path that starts with it


def refuses_the_key(error: ProviderError) -> bool:
    """Whether ``error`` is the server refusing the key rather than the request."""
    if error.status in KEY_REFUSED:
        return True
    said = str(error).partition(": ")[2]  # the server's words, not "<host> answered HTTP n"
    return error.status in _GATEWAY_KEY_STATUSES and bool(_ABOUT_THE_KEY.search(said))


def explained(
    error: ProviderError, key_names: tuple[str, ...], base_url: str, path: str, *, key_sent: bool
) -> ProviderError:
    """``error`` with what to do about it, for the statuses that have an answer; else as is.
    ``key_names``: the variables the key was read from (none: the caller passed it)."""
    if refuses_the_key(error):
        host = host_of(base_url)
        names = " or ".join(key_names) or "the API key"
        what = "check" if key_sent else "none was sent: set"
        return KeyRefusedError(
            f"{error} - the API key was rejected by {host}: {what} {names} and run again",
            status=error.status,
            kind=error.kind,
            retryable=False,  # the same key is refused again: never worth a retry
        )
    if error.status == 404:
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


__all__ = ["KEY_REFUSED", "explained", "refuses_the_key"]
