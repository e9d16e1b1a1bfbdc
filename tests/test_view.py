"""``mmirage view`` over real HTTP: a real pipeline run against the emulator (real CLI, real
files), then the viewer as a real subprocess, read with plain HTTP requests.

What it must hold: the landing page shows the shards, plots with data, failures by kind and
the last rows; a row's page shows its prompt as sent and its answer; every value is escaped
text (an answer holding HTML is never markup); no secret is shown; no path outside the
pipeline's files is served; nothing is written; a non-loopback address needs a token.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from provider_emulator import EmulatorConfig, Faults, running_emulator

XSS = "<img src=x onerror=alert(1)>"
SECRET = "sk-view-secret-0123456789abcdef"
ROWS = 120
DEADLINE_S = 120.0  # how long a condition may take to come true on a loaded machine


def write_pipeline(root: Path, base_url: str, rows: int = ROWS, shards: int = 2) -> Path:
    """A pipeline whose row 3 holds HTML and row 5 holds the API key."""
    texts = [XSS if i == 3 else f"my key is {SECRET}" if i == 5 else f"t{i}" for i in range(rows)]
    data = root / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    config = {
        "processors": [
            {
                "type": "llm",
                "base_url": base_url,
                "model": "echo",
                "max_retries": 0,
                "worker_concurrency": 1,  # one request at a time: the faults hit the same rows
                "default_sampling_params": {"max_new_tokens": 32},
                "price_per_mtok": {"input": 1.0, "output": 2.0},
            }
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "num_shards": shards,
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(root / "out")}],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Say {{ text }}"}],
            "output_schema": {"text": "{{ text }}", "answer": "{{ answer }}"},
        },
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def cli_env(root: Path) -> dict[str, str]:
    return {**os.environ, "OPENAI_API_KEY": SECRET, "XDG_CACHE_HOME": str(root / "cache")}


def mmirage(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(root),
        cwd=root,
    )


@contextmanager
def viewer(config: Path, *extra: str) -> Iterator[str]:
    """``mmirage view CONFIG --port 0`` in a subprocess; its URL (without the query)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmirage", "view", str(config), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(config.parent),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"(http://\S+?/)", line)
        assert found, f"no URL printed: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        yield found.group(1)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def get(url: str, method: str = "GET") -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def until(what: str, check: Any) -> Any:
    """Poll ``check`` until it answers something true (a condition, not a timing)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.2)


def tree_digest(*roots: Path) -> str:
    """Every file's path, size and content under ``roots``: what 'nothing written' compares."""
    digest = hashlib.sha256()
    for root in roots:
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            digest.update(f"{path}:{path.stat().st_mtime_ns}:".encode() + path.read_bytes())
    return digest.hexdigest()


def row_offset(root: Path, shard: int, row_id: int) -> int:
    data = (root / "out" / f"shard-{shard}-of-2.jsonl").read_bytes()
    return data.index(b'{"id":%d,' % row_id)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A finished pipeline of 120 rows, some failed by injected 500s: (root, config)."""
    root = tmp_path_factory.mktemp("view")
    with running_emulator(EmulatorConfig(faults=Faults(rate_500=0.2), seed=1)) as emu:
        config = write_pipeline(root, emu.openai_base_url)
        ran = mmirage("run", str(config), root=root)
        assert ran.returncode == 1, ran.stderr  # some rows failed (retryably)
    shard0 = (root / "out" / "shard-0-of-2.jsonl").read_text().splitlines()
    for row_id in (3, 5):  # the rows the tests read answered (the seed decides)
        assert json.loads(shard0[row_id])["__errors__"] is None, shard0[row_id]
    yield root, config


@pytest.fixture(scope="module")
def served(finished: tuple[Path, Path]) -> Iterator[tuple[Path, str]]:
    root, config = finished
    with viewer(config) as url:
        yield root, url


def failed_rows(root: Path) -> int:
    total = 0
    for path in (root / "out").glob("shard-*.jsonl"):
        total += sum(1 for line in path.read_text().splitlines() if json.loads(line)["__errors__"])
    return total


def test_the_landing_page_shows_shards_plots_failures_and_the_last_rows(
    served: tuple[Path, str],
) -> None:
    root, url = served
    failed = failed_rows(root)
    assert failed > 0
    # The failure counter reads the files in the background, one after the other: the table's
    # row shows a partial tally until every file is read (and the kind shows earlier, in the
    # last rows' errors), so wait for the whole tally.
    tallied = re.compile(r"<td>server_error</td><td>([\d,]+)</td><td>([\d,]+)</td>")

    def counted() -> Any:
        reply = get(url)
        found = tallied.search(reply[2])
        return found and int(found.group(1).replace(",", "")) == failed and reply

    status, headers, body = until("the failures counted", counted)
    assert status == 200
    assert "script-src" not in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    shards = body[body.index("<h2>Shards</h2>") :]
    assert shards.count('class="state-success"') == 2
    assert f"<b>{ROWS:,}</b>" in body  # rows done
    # Three plots, each a polyline with one point per time bin.
    assert body.count('<polyline class="series" points="') == 3
    assert "no data yet" not in body
    assert re.search(r"cost so far \(list prices\)<b>\$0\.0\d+", body)
    group = tallied.search(body)
    assert group, body
    assert int(group.group(1)) == failed and int(group.group(2)) == failed
    last = body[body.index("Last 20 finished rows") : body.index("<h2>Shards</h2>")]
    assert last.count('href="/row?') == 20
    assert "echo: Say t" in last


def test_an_answer_holding_html_is_shown_as_text(served: tuple[Path, str]) -> None:
    root, url = served
    status, headers, body = get(
        f"{url}row?dataset=0&shard=0&where=published&offset={row_offset(root, 0, 3)}"
    )
    assert status == 200, body
    assert "<img" not in body
    escaped = "&lt;img src=x onerror=alert(1)&gt;"
    assert f"Say {escaped}" in body  # the prompt as sent
    assert f"echo: Say {escaped}" in body  # the answer
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_no_secret_is_shown(served: tuple[Path, str]) -> None:
    root, url = served
    # Row 5's text holds the key the run used (the viewer's environment has it too).
    _, _, body = get(f"{url}row?dataset=0&shard=0&where=published&offset={row_offset(root, 0, 5)}")
    assert "my key is ***" in body
    assert SECRET not in body and SECRET[:12] not in body
    _, _, rows = get(f"{url}rows?dataset=0&shard=0")
    assert SECRET[:12] not in rows


def test_the_rows_table_pages_filters_and_searches(served: tuple[Path, str]) -> None:
    root, url = served
    _, _, first = get(f"{url}rows?dataset=0&shard=0")
    assert first.count('href="/row?') == 50
    following = re.search(r'href="(/rows\?[^"]*offset=(\d+)[^"]*)">next page', first)
    assert following, first
    offset = int(following.group(2))
    data = (root / "out" / "shard-0-of-2.jsonl").read_bytes()
    assert data[offset - 1 : offset] == b"\n" and data[:offset].count(b"\n") == 50
    _, _, second = get(url.rstrip("/") + following.group(1).replace("&amp;", "&"))
    assert second.count('href="/row?') == ROWS // 2 - 50
    assert "next page" not in second

    _, _, failed = get(f"{url}rows?dataset=0&shard=0&status=failed")
    published = [json.loads(line) for line in data.decode().splitlines()]
    assert failed.count('href="/row?') == sum(1 for r in published if r["__errors__"])
    _, _, ok = get(f"{url}rows?dataset=0&shard=0&status=ok")
    assert ok.count('href="/row?') == min(50, sum(1 for r in published if not r["__errors__"]))
    _, _, searched = get(f"{url}rows?dataset=0&shard=0&column=text&q=t17")
    assert searched.count('href="/row?') == 1 and "echo: Say t17" in searched


@pytest.mark.parametrize(
    "path",
    [
        "static/../../../../etc/passwd",
        "static/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "static/..%2fserver.py",
        "row?dataset=0&shard=0&where=../../../etc/passwd&offset=0",
        "row?dataset=../..&shard=0&where=published&offset=0",
        "rows?dataset=0&shard=0&where=%2fetc%2fpasswd",
        "row?dataset=0&shard=0&where=published&offset=5",  # not where a row starts
        "row?dataset=7&shard=0&where=published&offset=0",
    ],
)
def test_a_path_outside_the_pipeline_is_refused(served: tuple[Path, str], path: str) -> None:
    _, url = served
    status, _, body = get(url + path)
    assert status in (400, 404), (status, body[:300])
    assert "root:" not in body and "import" not in body


def test_no_endpoint_writes_anything(finished: tuple[Path, Path]) -> None:
    root, config = finished
    before = tree_digest(root / "out", root / "state")
    with viewer(config) as url:
        for path in ("", "rows?dataset=0&shard=1", "rows?dataset=0&shard=1&status=failed"):
            assert get(url + path)[0] == 200
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            assert get(url, method)[0] == 405
        until("a failure-count pass", lambda: "server_error" in get(url)[2])
    assert tree_digest(root / "out", root / "state") == before


def test_a_public_address_needs_a_token(finished: tuple[Path, Path]) -> None:
    root, config = finished
    refused = mmirage("view", str(config), "--host", "0.0.0.0", "--port", "0", root=root)
    assert refused.returncode == 2
    message = refused.stderr.strip().splitlines()[-1]
    assert "--host 0.0.0.0" in message and "--token" in message
    assert "Traceback" not in refused.stderr

    with viewer(config, "--token", "tok-123") as url:
        assert get(url)[0] == 403
        assert get(url + "?token=wrong")[0] == 403
        status, _, body = get(url + "?token=tok-123")
        assert status == 200
        assert "token=tok-123" in body  # the links carry it


@contextmanager
def viewing_a_running_pipeline(tmp_path: Path) -> Iterator[str]:
    """A run held back by a slow provider, with rows in its part file, and a viewer of it (its
    URL); the run is stopped (Ctrl-C) when the block ends."""
    with running_emulator(EmulatorConfig(latency_s=0.05)) as emu:
        config = write_pipeline(tmp_path, emu.openai_base_url, rows=2000, shards=1)
        run = subprocess.Popen(
            [sys.executable, "-m", "mmirage", "run", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=cli_env(tmp_path),
        )
        try:
            part = tmp_path / "out" / ".parts" / "shard-0-of-1.jsonl"
            until("rows in the part file", lambda: part.is_file() and part.stat().st_size > 0)
            with viewer(config) as url:
                yield url
        finally:
            run.send_signal(signal.SIGINT)
            run.wait(timeout=120)


def test_a_running_pipeline_is_shown_live(tmp_path: Path) -> None:
    """A run held back by a slow provider: the page shows its shard running, rows from the part
    file, and reloads itself."""
    with viewing_a_running_pipeline(tmp_path) as url:
        body = until(
            "the shard shown running",
            lambda: (b := get(url)[2]) and 'class="state-running"' in b and b,
        )
        assert '<meta http-equiv="refresh"' in body
        assert "last-rows" in body  # rows already finished are listed
        _, _, rows = get(f"{url}rows?dataset=0&shard=0&where=part")
        assert "part file shard-0-of-1.jsonl" in rows
        assert 'href="/row?dataset=0&amp;shard=0&amp;where=part&amp;offset=0' in rows


@pytest.mark.parametrize("fmt", ["parquet", "hf"])
def test_arrow_shards_page_by_row_number(tmp_path: Path, fmt: str) -> None:
    """Published Parquet and HF shards are paged by row number, one record batch at a time."""
    with running_emulator(EmulatorConfig()) as emu:
        config = write_pipeline(tmp_path, emu.openai_base_url, rows=80, shards=1)
        data = yaml.safe_load(config.read_text())
        data["loading_params"]["output_format"] = fmt
        config.write_text(yaml.safe_dump(data, sort_keys=False))
        ran = mmirage("run", str(config), root=tmp_path)
        assert ran.returncode == 0, ran.stderr
    with viewer(config) as url:
        _, _, first = get(f"{url}rows?dataset=0&shard=0")
        assert f"({fmt})" in first and first.count('href="/row?') == 50
        assert 'offset=50&amp;status=all">next page' in first
        _, _, second = get(f"{url}rows?dataset=0&shard=0&offset=50")
        assert second.count('href="/row?') == 30
        status, _, row = get(f"{url}row?dataset=0&shard=0&where=published&offset=3")
        assert status == 200 and "echo: Say &lt;img src=x onerror=alert(1)&gt;" in row
        _, _, landing = get(url)
        assert landing.count('href="/row?') >= 20  # the last rows, from the Arrow shard


def test_a_page_asked_for_under_another_host_name_is_refused(served: tuple[Path, str]) -> None:
    """A web page elsewhere may point its own host name at 127.0.0.1 (DNS rebinding) to read
    the viewer: without a token, only loopback host names are answered."""
    _, url = served
    port = url.rstrip("/").rsplit(":", 1)[1]
    for host, expected in (
        ("evil.example", 403),
        (f"evil.example:{port}", 403),
        (f"localhost:{port}", 200),
        (f"127.0.0.1:{port}", 200),
    ):
        request = urllib.request.Request(url, headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert status == expected, host


def test_a_batch_api_pipeline_shows_its_provider_batches(tmp_path: Path) -> None:
    """The receipts' batches, with the status and counts ``mmirage check`` stored."""
    from test_batch_collector import config_data

    with running_emulator(EmulatorConfig(seed=1)) as emu:
        config = tmp_path / "batch.yaml"
        config.write_text(yaml.safe_dump(config_data(tmp_path, emu), sort_keys=False))
        ran = mmirage("run", str(config), root=tmp_path)
        assert "submitted" in ran.stderr, ran.stderr  # (its data holds a bad row: exit 1)
        with viewer(config) as url:
            body = get(url)[2]
            assert "<h2>Provider batches</h2>" in body
            batches = body[body.index('<table class="batches">') :]
            submitted = batches.count("<tr><td>openai</td>")
            assert submitted > 0 and batches.count("not polled yet") == submitted
        merged = mmirage(
            "merge", str(config), "--output-path", "merged.jsonl", "--wait", root=tmp_path
        )
        assert "Traceback" not in merged.stderr, merged.stderr
        with viewer(config) as url:
            batches = get(url)[2].split('<table class="batches">')[1]
            assert batches.count("<td>completed</td>") == submitted, batches
            assert "not polled yet" not in batches
