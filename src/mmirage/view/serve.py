"""Starting the viewer: its background readers, the server, the printed URL, the browser."""

from __future__ import annotations

import asyncio
import contextlib
import webbrowser
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import click
from aiohttp import web

from mmirage.rundir import RunDir
from mmirage.view.context import ViewContext
from mmirage.view.server import make_app

if TYPE_CHECKING:
    from mmirage.config.models import MMirageConfig


async def _serve(context: ViewContext, host: str, port: int, open_browser: bool) -> None:
    runner = web.AppRunner(make_app(context), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    shown = f"[{host}]" if ":" in host else host
    query = "?" + urlencode({"token": context.token}) if context.token else ""
    url = f"http://{shown}:{bound}/{query}"
    click.echo(f"mmirage view: {url} (read only; Ctrl-C stops it)", err=False)
    if open_browser:
        webbrowser.open(url)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def serve(
    config: MMirageConfig, host: str, port: int, token: str | None, open_browser: bool
) -> None:
    context = ViewContext.of(config, RunDir.of(config), token)
    context.start()
    # Ctrl-C is how a viewer ends: it wrote nothing, so there is nothing to say.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(context, host, port, open_browser))
