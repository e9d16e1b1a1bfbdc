"""The page's frame and the few HTML pieces every page uses. Every value from data, a model
or a file goes through ``text`` (escaped, secrets redacted): nothing read is ever markup."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from functools import lru_cache
from html import escape
from typing import Any
from urllib.parse import urlencode

import orjson

from llm_kit.redact import clip, redact_text

# The page runs no script at all; styles and images come from the server only.
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
REFRESH_S = 5  # a live page reloads itself (no script: a meta refresh)
_SECRET_NAMES = ("KEY", "TOKEN", "SECRET", "PASSWORD")


@lru_cache(maxsize=1)
def _secrets() -> tuple[str, ...]:
    """The values of this process's credential variables: never shown, even if a row holds one."""
    return tuple(
        value
        for name, value in os.environ.items()
        if any(word in name.upper() for word in _SECRET_NAMES) and len(value) >= 8
    )


def text(value: Any) -> str:
    """``value`` as escaped, redacted text (JSON for anything but a string)."""
    if value is None:
        shown = ""
    elif isinstance(value, str):
        shown = value
    else:
        shown = orjson.dumps(value, default=str, option=orjson.OPT_INDENT_2).decode()
    return escape(redact_text(shown, _secrets()), quote=True)


def clipped(value: Any, limit: int = 160) -> str:
    """``value`` as ``text`` shows it, on one line, cut to ``limit`` characters at most:
    redacted before the cut (a secret cut first would keep a prefix no redactor knows)."""
    shown = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return escape(clip(redact_text(shown, _secrets()), limit - 1), quote=True)


def link(path: str, label: str, **query: Any) -> str:
    """A link inside the viewer (``label`` is escaped here)."""
    params = {k: v for k, v in query.items() if v is not None and v != ""}
    href = path + ("?" + urlencode(params) if params else "")
    return f'<a href="{escape(href, quote=True)}">{text(label)}</a>'


def table(header: Sequence[str], rows: Iterable[Sequence[str]], css: str = "") -> str:
    """A table whose cells are already HTML (made with ``text``/``link``)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    whole = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if whole >= size:
            return f"{whole // size}{unit} ago"
    return f"{whole}s ago"


def usd(amount: float | None) -> str:
    if amount is None:
        return "unknown"
    if amount < 0.01:
        return f"${amount:.6f}"  # a row's cost: cents would show nothing
    return f"${amount:,.4f}" if amount < 1 else f"${amount:,.2f}"


def page(title: str, body: str, *, refresh: bool = False, token: str | None = None) -> str:
    """The whole document. ``token``: carried on the navigation links by the caller."""
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    home = link("/", "mmirage view", token=token)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"{meta}<title>{text(title)}</title>"
        '<link rel="stylesheet" href="/static/view.css"></head>'
        f'<body><header>{home} <span class="muted">read at {stamp}</span></header>'
        f"<main><h1>{text(title)}</h1>{body}</main></body></html>"
    )
