"""The HTTP server: GET routes only, strict headers, an optional token, no path from a request.

Every route takes numbers and names from a fixed set, never a file path: the only files
served are the page's own assets (by exact name) and what ``rowfiles`` finds from the config.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from importlib import resources

from aiohttp import web

from llm_kit.hosts import is_loopback
from mmirage.errors import BadQuery, RowNotFound
from mmirage.view.context import ViewContext
from mmirage.view.html import CSP, page, text
from mmirage.view.landing import landing_page
from mmirage.view.rowfiles import PART, PUBLISHED
from mmirage.view.rowpages import FILTERS, RowsQuery, row_page, rows_page

ASSETS = {"view.css": "text/css"}  # the only files under /static/
CONTEXT = web.AppKey("context", ViewContext)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _number(request: web.Request, name: str, default: int | None = None) -> int:
    raw = request.query.get(name)
    if raw is None and default is not None:
        return default
    if raw is None or not raw.isdigit() or len(raw) > 18:
        raise BadQuery(f"'{name}' must be a whole number ≥ 0, not {raw!r}")
    return int(raw)


def _choice(request: web.Request, name: str, choices: tuple[str, ...], default: str) -> str:
    value = request.query.get(name, default)
    if value not in choices:
        raise BadQuery(f"'{name}' must be one of {', '.join(choices)}, not {value!r}")
    return value


def _html(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")


async def _landing(request: web.Request) -> web.Response:
    return _html(landing_page(request.app[CONTEXT]))


async def _rows(request: web.Request) -> web.Response:
    query = RowsQuery(
        dataset=_number(request, "dataset", 0),
        shard=_number(request, "shard", 0),
        where=_choice(request, "where", (PUBLISHED, PART), PUBLISHED),
        offset=_number(request, "offset", 0),
        status=_choice(request, "status", FILTERS, "all"),
        column=request.query.get("column", "")[:200],
        search=request.query.get("q", "")[:200],
    )
    return _html(rows_page(request.app[CONTEXT], query))


async def _row(request: web.Request) -> web.Response:
    context = request.app[CONTEXT]
    body = row_page(
        context,
        _number(request, "dataset"),
        _number(request, "shard"),
        _choice(request, "where", (PUBLISHED, PART), PUBLISHED),
        _number(request, "offset"),
    )
    return _html(body)


async def _asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound(text="no such asset")
    data = resources.files("mmirage.view").joinpath("static", name).read_bytes()
    return web.Response(body=data, content_type=ASSETS[name])


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Token, errors as one sentence, and the security headers on every answer."""
    context = request.app[CONTEXT]
    try:
        if context.token is None and not is_loopback(request.url.host or ""):
            # Another site's name pointed at 127.0.0.1 (DNS rebinding) must not read the page.
            raise web.HTTPForbidden(text="this viewer answers only at 127.0.0.1 or localhost")
        if context.token is not None and not hmac.compare_digest(
            request.query.get("token", ""), context.token
        ):
            raise web.HTTPForbidden(text="give the viewer's token: ?token=…")
        response = await handler(request)
    except BadQuery as exc:
        response = _html(page("Bad request", f"<p class='error'>{text(str(exc))}</p>"), 400)
    except RowNotFound as exc:
        response = _html(page("Not found", f"<p class='error'>{text(str(exc))}</p>"), 404)
    except web.HTTPException as exc:
        response = exc
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Cache-Control"] = "no-store"
    return response


def make_app(context: ViewContext) -> web.Application:
    app = web.Application(middlewares=[_guard])
    app[CONTEXT] = context
    app.router.add_get("/", _landing)
    app.router.add_get("/rows", _rows)
    app.router.add_get("/row", _row)
    app.router.add_get("/static/{name}", _asset)
    return app
