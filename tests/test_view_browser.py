"""``mmirage view`` in a real browser: headless Chromium (Debian's ``chromium``; ``.ci/run``
installs it), driven over the DevTools protocol with aiohttp's websocket client.

It loads the pages of a real finished pipeline and of a running one and checks what a person
would see: the shard table, plots drawn with points, the failure groups, a row's page; an
answer holding ``<img src=x onerror=…>`` is shown as text, no element is made of it and no
script runs (no dialog opens); a path outside the pipeline is refused. ``VIEW_SCREENSHOTS=DIR``
also saves the screenshots the docs page shows.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from test_view import (
    XSS,
    finished,
    get,
    row_offset,
    until,
    viewer,
    viewing_a_running_pipeline,
)

__all__ = ["finished"]  # the module fixture, shared with test_view

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "no chromium on PATH: 'apt-get install -y chromium' (.ci/run installs it)"


@pytest.fixture(autouse=True, scope="module")
def _chromium_here() -> None:
    """Skipped where Chromium is missing, except in CI, where these tests must run."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail(NO_CHROMIUM)
        pytest.skip(NO_CHROMIUM)


CDP_TIMEOUT_S = 120.0


@contextmanager
def chromium() -> Iterator[str]:
    """A headless Chromium of its own (own profile, a free debugging port): its HTTP address."""
    # Its helper processes may still write the profile while they exit after it.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [
                str(CHROMIUM),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "--window-size=1280,900",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                found = re.search(r"DevTools listening on ws://([^/]+)/", line)
                if found:
                    yield f"http://{found.group(1)}"
                    break
            else:
                pytest.fail("chromium exited without opening its DevTools port")
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Tab:
    """One page over the DevTools protocol: what it loaded, what ran in it."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.next_id = 0
        self.dialogs: list[dict[str, Any]] = []  # alert(), confirm()…: script ran
        self.events: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        sent = self.next_id
        await self.ws.send_str(json.dumps({"id": sent, "method": method, "params": params}))
        while True:
            message = await self.ws.receive_json(timeout=CDP_TIMEOUT_S)
            if message.get("id") == sent:
                assert "error" not in message, message
                return dict(message.get("result") or {})
            self._note(message)

    def _note(self, message: dict[str, Any]) -> None:
        method = message.get("method", "")
        self.events.append(method)
        if method == "Page.javascriptDialogOpening":
            self.dialogs.append(message["params"])

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        while "Page.loadEventFired" not in self.events:
            self._note(await self.ws.receive_json(timeout=CDP_TIMEOUT_S))
        self.events.clear()

    async def value(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def screenshot(self, name: str) -> None:
        folder = os.environ.get("VIEW_SCREENSHOTS")
        if folder:
            shot = await self.call("Page.captureScreenshot", format="png")
            Path(folder, name).write_bytes(base64.b64decode(shot["data"]))


async def _session(browser: str, visit: Any) -> Any:
    async with aiohttp.ClientSession() as http:
        async with http.put(f"{browser}/json/new?about:blank") as answer:
            target = await answer.json(content_type=None)
        async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            tab = Tab(ws)
            await tab.call("Page.enable")
            await tab.call("Runtime.enable")
            await tab.call(
                "Emulation.setDeviceMetricsOverride",
                width=1280,
                height=900,
                deviceScaleFactor=1,
                mobile=False,
            )
            return await visit(tab)


def in_browser(visit: Any) -> Any:
    with chromium() as browser:
        return asyncio.run(_session(browser, visit))


def test_a_finished_pipeline_in_the_browser(finished: tuple[Path, Path]) -> None:
    root, config = finished

    async def visit(tab: Tab) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        await tab.open(url)
        seen["shards"] = await tab.value(
            "[...document.querySelectorAll('table.shards tbody tr')].map(r => r.innerText)"
        )
        seen["points"] = await tab.value(
            "[...document.querySelectorAll('svg polyline')]"
            ".map(p => p.getAttribute('points').trim().split(' ').length)"
        )
        seen["drawn"] = await tab.value(
            "[...document.querySelectorAll('svg polyline')].map(p => p.getBBox().height)"
        )
        seen["failures"] = await tab.value(
            "[...document.querySelectorAll('table.failures tbody tr')].map(r => r.innerText)"
        )
        seen["last"] = await tab.value("document.querySelectorAll('table.last-rows tr').length")
        await tab.screenshot("view-landing.png")
        await tab.open(f"{url}row?dataset=0&shard=0&where=published&offset={xss_offset}")
        seen["row_text"] = await tab.value("document.body.innerText")
        seen["images"] = await tab.value("document.images.length")
        seen["onerror"] = await tab.value("document.querySelectorAll('[onerror]').length")
        await tab.screenshot("view-row.png")
        await tab.open(f"{url}rows?dataset=0&shard=0&status=failed")
        seen["failed_rows"] = await tab.value(
            "document.querySelectorAll('table.rows tbody tr').length"
        )
        await tab.screenshot("view-rows.png")
        await tab.open(f"{url}static/..%2f..%2f..%2fetc%2fpasswd")
        seen["traversal"] = await tab.value("document.body.innerText")
        seen["dialogs"] = tab.dialogs
        return seen

    xss_offset = row_offset(root, 0, 3)
    with viewer(config) as url:
        until("the failures counted", lambda: "server_error" in get(url)[2])
        seen = in_browser(visit)

    assert len(seen["shards"]) == 2 and all("success" in r for r in seen["shards"])
    assert seen["points"] == [60, 60, 61]  # cost starts from 0
    assert all(height > 0 for height in seen["drawn"]), seen["drawn"]  # lines, not flat
    assert len(seen["failures"]) == 1 and seen["failures"][0].startswith("server_error")
    assert seen["last"] == 21  # the header and 20 rows
    assert f"echo: Say {XSS}" in seen["row_text"]  # the answer, as text
    assert seen["images"] == 0 and seen["onerror"] == 0  # no element made of it
    assert seen["dialogs"] == []  # and no script ran
    assert seen["failed_rows"] > 0
    assert "root:" not in seen["traversal"]


def test_a_running_pipeline_in_the_browser(tmp_path: Path) -> None:
    async def visit(tab: Tab) -> dict[str, Any]:
        await tab.open(url)
        seen = {
            "states": await tab.value(
                "[...document.querySelectorAll('table.shards tbody tr td:nth-child(2)')]"
                ".map(c => c.innerText)"
            ),
            "refresh": await tab.value(
                "document.querySelector('meta[http-equiv=refresh]')?.content"
            ),
            "rows": await tab.value("document.querySelectorAll('table.last-rows tr').length"),
        }
        await tab.screenshot("view-running.png")
        return seen

    with viewing_a_running_pipeline(tmp_path) as url:
        until("the shard shown running", lambda: "state-running" in get(url)[2])
        seen = in_browser(visit)
    assert seen["states"] == ["running"]
    assert seen["refresh"] == "5"
    assert seen["rows"] > 1
