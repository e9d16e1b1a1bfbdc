"""A gateway that quotes the key *escaped* (JSON ``\\u0073\\u006b…``, ``\\/``, mixed, or JSON
inside a JSON string), or quotes it in a non-JSON 200 page where it straddles the 120th
character, never gets the key, nor any 12-character piece of it, written anywhere: not in
shards, merged rows, status files, job files, ``batch_to_jsonl`` / ``run_batch_api`` records,
exceptions, logs, stdout or stderr. Every text is also searched with its escapes undone.

A small proxy sits in front of the emulator (the mechanism of ``test_key_redaction.py``):

* a live request whose prompt holds QUOTE400 / QUOTE500 gets that status with a body quoting
  the key in every escaped form; HTMLPAGE gets a 200 HTML page with the key in clear from
  character 71 (so 49 of its 50 characters fall before character 120); HTMLESC the same page
  with the key as HTML character references;
* under ``/deny`` every request gets 401 with the quoting body;
* under ``/results`` an OpenAI batch's result file has every line turned into a 400 quoting
  the key; under ``/failedbatch`` every poll says the batch failed, with errors quoting it;
  under ``/badpoll`` every poll of one batch gets 400, under ``/badupload`` every POST.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import aiohttp
import pytest
from aiohttp import web

from batch_spec_support import Cli, cli_env, mmirage, write_rows, write_yaml
from llm_kit import LLM, BatchConfig, BatchItem, Message
from llm_kit.errors import ProviderError
from llm_kit.redact import clip, redact, redact_bytes, redact_text
from provider_emulator.runner import EmulatorHandle
from test_key_redaction import live_pipeline

# 50 characters, with a "/" (JSON may write it "\/") and a "-" (written "\u002d" below).
SECRET = "sk-proj-Esc/4pE7qL2vN9xR3tW8yZ1bC6dF0gH5jKMq8uV2wY"
PIECE = 12  # no run of this many of the key's characters may be written anywhere
_PIECES = {SECRET[i : i + PIECE] for i in range(len(SECRET) - PIECE + 1)}
_ENV_KEY = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
_STRADDLE_AT = 71  # the key's first character in the HTML page: 49 of 50 before 120


# -- how a gateway quotes the key ----------------------------------------------------------------


def _u_escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


def _mixed(text: str) -> str:
    """Every other character \\u-escaped (upper-case hex), "/" as "\\/", the rest in clear."""
    return "".join(
        "\\/" if c == "/" else f"\\u{ord(c):04X}" if i % 2 == 0 else c for i, c in enumerate(text)
    )


def _quoting_message() -> str:
    """A message as it sits inside a JSON string on the wire: the key \\u-escaped, mixed, and
    inside a JSON text that is itself a JSON string (escaped twice)."""
    inner = '{"error": {"message": "upstream saw the key ' + _u_escaped(SECRET) + '"}}'
    return (
        f"the gateway refused key {_u_escaped(SECRET)} (also sent as {_mixed(SECRET)}); "
        f"upstream answered {json.dumps(inner)[1:-1]}"
    )


def _quoting_body() -> str:
    """An error body in the shape all three providers use (``error.message``)."""
    return '{"error": {"message": "' + _quoting_message() + '", "type": "gateway_error"}}'


def _html_page(entities: bool = False) -> str:
    key = "".join(f"&#{ord(c)};" for c in SECRET) if entities else SECRET
    head = "<html><body><h1>502 Bad gateway</h1><p>request key: "
    return head.ljust(_STRADDLE_AT) + key + "</p></body></html>"


# -- the proxy -----------------------------------------------------------------------------------


def _json_error(status: int) -> web.Response:
    return web.Response(status=status, text=_quoting_body(), content_type="application/json")


def _failed_batch(answer: bytes) -> bytes:
    """An OpenAI batch answer turned into a failed batch whose errors quote the key."""
    data = json.loads(answer)
    data.update(status="failed", output_file_id=None, error_file_id=None, errors="@ERRORS@")
    errors = '{"object": "list", "data": [{"code": "gateway_error", "message": "'
    errors += _quoting_message() + '"}]}'
    return json.dumps(data).replace('"@ERRORS@"', errors).encode()


def _errored_lines(answer: bytes) -> bytes:
    """An OpenAI result file with every line turned into a 400 whose body quotes the key."""
    lines = []
    for line in answer.splitlines():
        record = json.loads(line)
        record["response"] = {"status_code": 400, "request_id": "req", "body": "@BODY@"}
        lines.append(json.dumps(record).replace('"@BODY@"', _quoting_body()))
    return ("\n".join(lines) + "\n").encode()


async def _answer(request: web.Request, path: str, body: bytes) -> web.Response | None:
    """The gateway's own answer, or None to forward the request."""
    prefix = path.split("/")[1]
    if prefix == "deny":
        return _json_error(401)
    if prefix == "badupload" and request.method == "POST":
        return _json_error(400)
    if prefix == "badpoll" and request.method == "GET" and re.search(r"/batches/[^/]+$", path):
        return _json_error(400)
    for status in (400, 500):
        if f"QUOTE{status}".encode() in body:
            return _json_error(status)
    if b"HTMLPAGE" in body or b"HTMLESC" in body:
        return web.Response(text=_html_page(b"HTMLESC" in body), content_type="text/html")
    return None


_REWRITES = {"failedbatch": (r"/batches/[^/]+$", _failed_batch)}
_REWRITES["results"] = (r"/files/[^/]+/content$", _errored_lines)
_PREFIXES = ("deny", "badupload", "badpoll", *_REWRITES)


@contextlib.contextmanager
def gateway(upstream: str) -> Iterator[str]:
    """The proxy's base URL, served on its own thread and loop."""
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path_qs
        own = await _answer(request, path, body)
        if own is not None:
            return own
        prefix = path.split("/")[1]
        forwarded = path[len(prefix) + 1 :] if prefix in _PREFIXES else path
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, upstream + forwarded, data=body, headers=headers) as up,
        ):
            answer = await up.read()
            rewrite = _REWRITES.get(prefix)
            if rewrite and up.status == 200 and re.search(rewrite[0], request.path):
                answer = rewrite[1](answer)
            return web.Response(status=up.status, body=answer, content_type=up.content_type)

    async def serve() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state["stop"] = asyncio.Event()
        ready.set()
        await state["stop"].wait()
        await runner.cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10), "the gateway proxy did not start"
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        loop.call_soon_threadsafe(state["stop"].set)
        thread.join(10)


@pytest.fixture(scope="module")
def proxy(emulator: EmulatorHandle) -> Iterator[str]:
    with gateway(emulator.url) as url:
        yield url


def _base_url(proxy: str, fmt: str, prefix: str = "") -> str:
    root = proxy + (f"/{prefix}" if prefix else "")
    return root + "/v1" if fmt == "openai" else root


# -- what counts as a leak -----------------------------------------------------------------------

_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})|\\(.)", re.DOTALL)


def _readings(text: str) -> list[str]:
    """``text``, and ``text`` with its escapes undone once, twice, … (JSON, URL, HTML)."""
    readings = [text]
    for _ in range(6):
        undone = _ESCAPE.sub(lambda m: chr(int(m[1], 16)) if m[1] else m[2], readings[-1])
        undone = html.unescape(unquote(undone))
        if undone == readings[-1]:
            break
        readings.append(undone)
    return readings


def _leaks(text: str) -> bool:
    """Whether ``text``, in any reading, holds a 12-character piece of the key."""
    return any(piece in reading for reading in _readings(text) for piece in _PIECES)


def _holding_the_key(root: Path, runs: list[Cli], *texts: tuple[str, str]) -> list[str]:
    found = [
        str(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and _leaks(p.read_bytes().decode("utf-8", "replace"))
    ]
    for run in runs:
        for name, text in (("stdout", run.out), ("stderr", run.err)):
            if _leaks(text):
                found.append(f"{name} of mmirage {' '.join(run.argv[:1])}")
    return found + [name for name, text in texts if _leaks(text)]


def test_the_leak_finder_sees_every_quoting_form() -> None:
    """The assertion itself: each form the gateway uses is found (so a pass means something)."""
    assert _leaks(_quoting_body()) and _leaks(json.loads(_quoting_body())["error"]["message"])
    assert _leaks(_html_page()[:120]) and _leaks(_html_page(entities=True))
    assert not _leaks(_html_page().replace(SECRET, "***"))


# -- the redactor on its own ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "wire",
    [
        _u_escaped(SECRET),
        _mixed(SECRET),
        SECRET.replace("/", "\\/"),
        json.dumps('{"k": "' + _u_escaped(SECRET) + '"}')[1:-1],  # escaped twice
        "".join(f"%{ord(c):02X}" for c in SECRET),
        "".join(f"&#x{ord(c):x};" for c in SECRET),
    ],
    ids=["unicode", "mixed", "solidus", "twice", "percent", "html"],
)
def test_a_key_is_redacted_in_any_escaped_form(wire: str) -> None:
    body = ('{"error": {"message": "key ' + wire + '", "code": 7}}').encode()
    for cleaned in (
        redact_bytes(body, [SECRET]).decode(),
        redact_text(json.loads(body)["error"]["message"], [SECRET]),
        str(redact(json.loads(body), [SECRET])),
    ):
        assert not _leaks(cleaned), cleaned
        assert "***" in cleaned
    assert json.loads(redact_bytes(body, [SECRET]))["error"]["code"] == 7  # still JSON


def test_a_piece_of_a_key_is_redacted_and_a_cut_keeps_no_prefix() -> None:
    # Cut before it got here (by a gateway): the 49 characters that were left.
    assert redact_text(f"page: {SECRET[:49]}", [SECRET]) == "page: ***"
    assert redact_text(f"{SECRET[7:]} was the key", [SECRET]) == "*** was the key"
    # A cut never ends inside a word a key could be, known or not.
    page = _html_page()
    assert clip(page, 120) == page[:_STRADDLE_AT] + "…"
    assert clip("short", 120) == "short"
    # Ordinary text keeps its escapes and its words.
    prose = 'a "quoted" word, 50% off, C:\\temp & more'
    assert redact_text(prose, [SECRET]) == prose


# -- the live path: mmirage run and everything after it ------------------------------------------

ROWS = [
    {"text": "alpha"},
    {"text": "QUOTE400 beta"},
    {"text": "QUOTE500 gamma"},
    {"text": "HTMLPAGE delta"},
    {"text": "HTMLESC epsilon"},
    {"text": "zeta"},
]


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_a_live_run_writes_no_escaped_or_cut_key(fmt: str, proxy: str, tmp_path: Path) -> None:
    env = cli_env(**{_ENV_KEY[fmt]: SECRET})
    quoted = tmp_path / "quoted"
    config = live_pipeline(quoted, fmt, _base_url(proxy, fmt), ROWS)
    runs = [mmirage("run", config, env=env)]
    runs += [mmirage(command, config, env=env) for command in ("check", "stats", "retry")]
    merged = quoted / "merged"
    runs.append(mmirage("merge", config, "--format", "jsonl", "--output-root", merged, env=env))
    denied = tmp_path / "denied"
    denied_config = live_pipeline(denied, fmt, _base_url(proxy, fmt, "deny"), ROWS)
    runs += [mmirage(command, denied_config, env=env) for command in ("run", "stats")]

    assert runs[4].code == 0, str(runs[4])
    rows = [
        json.loads(line) for p in merged.rglob("*.jsonl") for line in p.read_text().splitlines()
    ]
    errors = {row["text"]: json.dumps(row["__errors__"]) for row in rows if row["__errors__"]}
    # Every gateway answer was kept as its row's error, with the key blanked.
    assert sorted(errors) == ["HTMLESC epsilon", "HTMLPAGE delta", "QUOTE400 beta",
                              "QUOTE500 gamma"], rows  # fmt: skip
    assert "the gateway refused key ***" in errors["QUOTE400 beta"]
    assert "does not parse" in errors["HTMLPAGE delta"]
    assert "HTTP 401" in runs[5].err and list(denied.rglob("status.json"))
    leaks = _holding_the_key(tmp_path, runs)
    assert not leaks, "the key was written to: " + "; ".join(leaks)


async def test_llm_kit_live_calls_keep_no_key(
    proxy: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    rejections: list[tuple[str, str]] = []
    for fmt in ("openai", "anthropic", "gemini"):
        llm = LLM(
            model="echo",
            message_format=fmt,
            base_url=_base_url(proxy, fmt),
            api_key=SECRET,
            config=BatchConfig(max_retries=0),
        )
        items = [BatchItem(f"{fmt}-{i}", [Message.user(row["text"])]) for i, row in enumerate(ROWS)]
        await llm.batch_to_jsonl(items, tmp_path / f"{fmt}.jsonl")
        await llm.aclose()
        denied = LLM(model="echo", message_format=fmt, base_url=_base_url(proxy, fmt, "deny"),
                     api_key=SECRET)  # fmt: skip
        with pytest.raises(ProviderError) as rejected:
            await denied.complete("hello")
        await denied.aclose()
        rejections.append((f"the 401 of {fmt}", str(rejected.value)))
    written = "".join(p.read_text() for p in sorted(tmp_path.glob("*.jsonl")))
    assert written.count('"ok":false') == 3 * 4  # each format's four quoting answers
    assert written.count("***") >= 3 * 4
    out, err = capfd.readouterr()
    leaks = _holding_the_key(
        tmp_path, [], *rejections, ("stdout", out), ("stderr", err), ("the log", caplog.text)
    )
    assert not leaks, "the key was written to: " + "; ".join(leaks)


# -- the batch path: llm_kit's batch API ---------------------------------------------------------


async def test_llm_kit_batch_api_keeps_no_key(
    proxy: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("LLM_KIT_CACHE_DIR", str(tmp_path / "cache"))
    items = [BatchItem(f"q{i}", [Message.user(f"question {i}")]) for i in range(4)]

    def llm(prefix: str) -> LLM:
        return LLM(model="echo", base_url=_base_url(proxy, "openai", prefix), api_key=SECRET)

    texts: list[tuple[str, str]] = []
    for prefix in ("results", "failedbatch"):
        client = llm(prefix)
        await client.run_batch_api(items, tmp_path / f"{prefix}.jsonl", poll_interval=0.01)
        await client.aclose()
    for prefix, step in (("badupload", "submit"), ("badpoll", "poll")):
        client = llm(prefix)
        with pytest.raises(ProviderError) as failed:
            job = await client.submit_batch(items, spool_dir=tmp_path / prefix)
            job.save(tmp_path / f"{prefix}.job.json")
            await client.poll_batch(job)
        await client.aclose()
        assert failed.value.status == 400, (step, failed.value)
        texts.append((f"the {step} error", str(failed.value)))

    records = [
        json.loads(line)
        for p in tmp_path.glob("*.jsonl")
        for line in p.read_text().split("\n")
        if line
    ]
    assert len(records) == 8 and not any(r["ok"] for r in records)
    assert all("***" in r["error"] for r in records), records
    assert "failed at the provider" in (tmp_path / "failedbatch.jsonl").read_text()
    out, err = capfd.readouterr()
    leaks = _holding_the_key(
        tmp_path, [], *texts, ("stdout", out), ("stderr", err), ("the log", caplog.text)
    )
    assert not leaks, "the key was written to: " + "; ".join(leaks)


# -- the batch path: mmirage's batch_api processor -----------------------------------------------


def _batch_pipeline(root: Path, base_url: str) -> Path:
    rows = [{"q": f"question {i}"} for i in range(6)]
    return write_yaml(
        root / "config.yaml",
        {
            "processors": [
                {
                    "type": "batch_api",
                    "provider": "openai",
                    "model": "gpt-4o-mini",
                    "base_url": base_url,
                    "metadata_output_path": str(root / "meta" / "batch_metadata.jsonl"),
                    "max_requests_per_chunk": 3,
                }
            ],
            "loading_params": {
                "datasets": [
                    {
                        "path": write_rows(root / "rows.jsonl", rows),
                        "type": "JSONL",
                        "output_dir": str(root / "out"),
                    }
                ],
                "num_shards": 1,
                "state_dir": str(root / "state"),
                "output_format": "jsonl",
            },
            "processing_params": {
                "inputs": [{"name": "q", "key": "q"}],
                "outputs": [{"name": "answer", "type": "batch_api", "prompt": "Say {{ q }}"}],
                "output_schema": {"q": "{{ q }}", "answer": "{{ answer }}"},
            },
        },
    )


def test_a_batch_api_run_writes_no_escaped_key(proxy: str, tmp_path: Path) -> None:
    env = cli_env(OPENAI_API_KEY=SECRET)
    runs: list[Cli] = []
    for prefix in ("results", "failedbatch", "badpoll", "badupload"):
        root = tmp_path / prefix
        config = _batch_pipeline(root, _base_url(proxy, "openai", prefix))
        runs.append(mmirage("run", config, env=env))
        if prefix == "badupload":
            assert runs[-1].code != 0 and "HTTP 400" in runs[-1].err, str(runs[-1])
            continue
        assert runs[-1].code == 0, str(runs[-1])
        runs.append(mmirage("check", config, env=env))
        merged = root / "merged.jsonl"
        runs.append(mmirage("merge", config, "--output-path", merged, env=env))
        if prefix == "badpoll":
            assert "HTTP 400" in runs[-2].out + runs[-2].err, str(runs[-2])
            continue
        rows = [json.loads(line) for line in merged.read_text().splitlines()]
        said = "***" if prefix == "results" else "failed at the provider"
        assert len(rows) == 6 and all(said in json.dumps(r["__errors__"]) for r in rows), rows
    leaks = _holding_the_key(tmp_path, runs)
    assert not leaks, "the key was written to: " + "; ".join(leaks)


# -- the texts that do not come through llm_kit's transport ---------------------------------------


def test_an_image_url_is_named_without_its_key() -> None:
    from llm_kit.images import describe_image

    named = describe_image(f"https://images.example/cat.png?key={SECRET}&size=large")
    assert "images.example/cat.png" in named and not _leaks(named)


def test_the_dialect_log_names_a_base_url_without_its_key(caplog: pytest.LogCaptureFixture) -> None:
    from llm_kit.dialect_choice import dialect_choice

    choice = dialect_choice(f"http://127.0.0.1:9/v1?api_key={SECRET}", "m", "auto")
    with caplog.at_level(logging.INFO, logger="llm_kit"):
        first = choice.current
        choice.moved_on(first, 400, b'{"error": {"message": "response_format is unsupported"}}')
        choice.judged(choice.current, fits=True)  # says which dialect the server follows
    assert caplog.records and not _leaks(caplog.text)


def test_a_custom_adapters_error_rows_are_redacted_before_they_are_stored() -> None:
    from mmirage.core.process.batch.adapter import BatchSubmissionAdapter
    from mmirage.core.process.batch.fetching import download_whole
    from mmirage.core.process.batch.results_store import BatchRecord

    class Quoting(BatchSubmissionAdapter):  # a plugin that quotes the provider's answer
        def build_request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            raise NotImplementedError

        def submit_chunk(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            raise NotImplementedError

        def parse_submission_result(self, raw_result: dict[str, Any]) -> Any:
            raise NotImplementedError

        def check_batch_status(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

        def retrieve_results(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
            quoted = json.dumps({"error": f"bad key {SECRET}"}).replace("/", "\\/")
            return [
                {"custom_id": "0::0::0", "status": "error", "error_message": quoted},
                {"custom_id": "0::1::0", "generated_text": "fine"},
            ]

    adapter = Quoting({"api_key": SECRET})
    rows = download_whole(adapter, BatchRecord("mistral", "b1"), None, 2)  # type: ignore[arg-type]
    assert not _leaks(json.dumps(rows)) and "***" in rows[0]["error_message"]
    assert rows[1] == {"custom_id": "0::1::0", "generated_text": "fine"}
