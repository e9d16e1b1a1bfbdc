"""``mmirage view``: a read-only local web page of one pipeline (``mmirage.view``)."""

from __future__ import annotations

from pathlib import Path

import click

from mmirage.cli.errors import exit_on_errors
from mmirage.cli.options import config_params, config_path, load


@click.command("view")
@config_params
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    help="The port to listen on (0: any free one).",
)
@click.option(
    "--token",
    envvar="MMIRAGE_VIEW_TOKEN",
    default=None,
    help="Required as ?token=… on every request; needed to listen beyond this machine "
    "[env: MMIRAGE_VIEW_TOKEN].",
)
@click.option("--open", "open_browser", is_flag=True, help="Open the page in a browser.")
def view(
    config: Path | None,
    config_option: Path | None,
    host: str,
    port: int,
    token: str | None,
    open_browser: bool,
) -> None:
    """Serve a read-only web page of the pipeline: shards, rates, cost, failures, rows.

    Live while a run goes on (the page reloads itself) and after it ended, in any mode; it
    reads only the files the run writes and changes none. Prints its URL; Ctrl-C stops it.

    CONFIG is the pipeline's YAML file (or give it as --config CONFIG).
    """
    from llm_kit.hosts import is_loopback
    from mmirage.view.serve import serve

    path = config_path(config, config_option)
    if not is_loopback(host) and not token:
        raise click.UsageError(
            f"--host {host} lets other machines read the pipeline's rows: give --token "
            "SECRET too (or MMIRAGE_VIEW_TOKEN), or keep the default --host 127.0.0.1"
        )
    with exit_on_errors():
        cfg = load(path)
    serve(cfg, host, port, token, open_browser)
