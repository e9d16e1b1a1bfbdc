"""Who is at a base URL: the provider at its own address, else the server named by its host.

Error texts say who answered (``127.0.0.1:8080 answered HTTP 500``, not ``openai answered``
for a llama.cpp server or a gateway), and the key's notes say where a key goes.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import SplitResult, urlsplit

_LOCAL_NAMES = frozenset({"localhost", "localhost.localdomain"})


def host_port(parts: SplitResult) -> str:
    """``host[:port]`` of a split URL: its netloc without ``user:password@`` (brackets of an
    IPv6 address kept)."""
    return parts.netloc.rpartition("@")[2]


def host_of(url: str) -> str:
    """``host[:port]`` of ``url`` (the URL itself when it has none)."""
    return host_port(urlsplit(url)) or url


def server_name(provider: str, home_url: str, base_url: str | None) -> str:
    """``provider`` when ``base_url`` is unset or at the provider's own host, else the host."""
    if base_url is None or host_of(base_url) == host_of(home_url):
        return provider
    return host_of(base_url)


def on_this_machine(url: str) -> bool:
    """Whether ``url`` points at this machine (a loopback address or ``localhost``)."""
    return is_loopback(urlsplit(url).hostname or "")


def is_loopback(hostname: str) -> bool:
    """Whether ``hostname`` (no port, no brackets) is this machine's: ``localhost`` or a
    loopback address."""
    if hostname.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


__all__ = ["host_of", "host_port", "is_loopback", "on_this_machine", "server_name"]
