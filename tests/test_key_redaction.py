"""A gateway that quotes the request's credentials in its error bodies never gets the key
written anywhere: not in shards, the merged dataset, status.json, ``mmirage stats``, stdout,
stderr, nor in ``batch_to_jsonl``'s ``error`` field.

A small proxy sits in front of the emulator: a prompt holding FAIL400 or FAIL500 gets that
status, and every request under ``/deny`` gets 401; each of those bodies quotes the request's
``Authorization`` and ``x-api-key`` headers and the bare token. Everything else is forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from batch_spec_support import Cli, cli_env, mmirage, write_rows, write_yaml
from llm_kit import LLM, BatchConfig, BatchItem, Message
from llm_kit.errors import ProviderError
from llm_kit.redact import redact, redact_text
from provider_emulator.runner import EmulatorHandle

SECRET = "sk-gateway-echo-LEAK-9d2b7e41"
_DENY = "/deny"
_ENV_KEY = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


def _echo_body(request: web.Request, status: int) -> dict[str, Any]:
    auth = request.headers.get("Authorization", "")
    api_key = request.headers.get("x-api-key", "")
    token = auth.partition(" ")[2] or api_key
    return {
        "error": {
            "message": f"HTTP {status} from the gateway; request headers were "
            f"Authorization: {auth} x-api-key: {api_key} (token {token})",
            "type": "gateway_error",
            "headers": {"authorization": auth, "x-api-key": api_key},
        }
    }


@contextlib.contextmanager
def echoing_proxy(upstream: str) -> Iterator[str]:
    """The proxy's base URL, served on its own thread and loop."""
    ready: threading.Event = threading.Event()
    state: dict[str, Any] = {}

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        path = request.path_qs
        if path.startswith(_DENY):
            return web.json_response(_echo_body(request, 401), status=401)
        for status in (400, 500):
            if f"FAIL{status}".encode() in body:
                return web.json_response(_echo_body(request, status), status=status)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with (
            aiohttp.ClientSession() as session,
            session.request(request.method, upstream + path, data=body, headers=headers) as up,
        ):
            return web.Response(
                status=up.status, body=await up.read(), content_type=up.content_type
            )

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
    assert ready.wait(10), "the proxy did not start"
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        loop.call_soon_threadsafe(state["stop"].set)
        thread.join(10)


@pytest.fixture(scope="module")
def proxy(emulator: EmulatorHandle) -> Iterator[str]:
    with echoing_proxy(emulator.url) as url:
        yield url


def _base_url(proxy: str, fmt: str, *, deny: bool = False) -> str:
    root = proxy + (_DENY if deny else "")
    return root + "/v1" if fmt == "openai" else root


ROWS = [{"text": "alpha"}, {"text": "FAIL400 beta"}, {"text": "FAIL500 gamma"}, {"text": "delta"}]


def live_pipeline(
    root: Path, fmt: str, base_url: str, rows: Sequence[Mapping[str, Any]] = ROWS
) -> Path:
    """One live ``llm`` output over ``rows``, no retries, through ``base_url``."""
    config = {
        "processors": [
            {
                "type": "llm",
                "message_format": fmt,
                "base_url": base_url,
                "model": "echo",
                "max_retries": 0,
            }
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [
                {
                    "path": write_rows(root / "rows.jsonl", rows),
                    "type": "JSONL",
                    "output_dir": str(root / "out"),
                }
            ],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Say {{ text }}"}],
            "output_schema": {"text": "{{ text }}", "answer": "{{ answer }}"},
        },
    }
    return write_yaml(root / "pipeline.yaml", config)


def _holding_the_key(root: Path, runs: list[Cli]) -> list[str]:
    """Every file under ``root`` and every stream of ``runs`` that holds the key."""
    found = [
        str(p) for p in sorted(root.rglob("*")) if p.is_file() and SECRET.encode() in p.read_bytes()
    ]
    for run in runs:
        for name, text in (("stdout", run.out), ("stderr", run.err)):
            if SECRET in text:
                found.append(f"{name} of mmirage {' '.join(run.argv[:1])}")
    return found


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_live_run_writes_no_key_when_the_gateway_quotes_it(
    fmt: str, proxy: str, tmp_path: Path
) -> None:
    env = cli_env(**{_ENV_KEY[fmt]: SECRET})
    failing = tmp_path / "failing"
    config = live_pipeline(failing, fmt, _base_url(proxy, fmt))
    runs = [mmirage("run", config, env=env)]
    merged_root = failing / "merged"
    runs.append(
        mmirage("merge", config, "--format", "jsonl", "--output-root", merged_root, env=env)
    )
    runs.append(mmirage("stats", config, env=env))
    denied = tmp_path / "denied"
    denied_config = live_pipeline(denied, fmt, _base_url(proxy, fmt, deny=True))
    runs.append(mmirage("run", denied_config, env=env))
    runs.append(mmirage("stats", denied_config, env=env))

    assert runs[1].code == 0, str(runs[1])
    merged = "".join(p.read_text() for p in merged_root.rglob("*") if p.is_file())
    # Both quoting errors were kept, as the rows' recorded errors.
    assert merged.count("from the gateway") == 2 and "HTTP 400" in merged
    assert "HTTP 401" in runs[3].err  # the rejected key was reported
    assert list(denied.rglob("status.json")), "the denied run wrote no status.json"
    leaks = _holding_the_key(tmp_path, runs)
    assert not leaks, "the key was written to: " + "; ".join(leaks)


async def test_batch_to_jsonl_writes_no_key_when_the_gateway_quotes_it(
    proxy: str, tmp_path: Path
) -> None:
    rejections: list[ProviderError] = []
    for fmt in ("openai", "anthropic"):
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
        denied = LLM(model="echo", message_format=fmt, base_url=_base_url(proxy, fmt, deny=True),
                     api_key=SECRET)  # fmt: skip
        with pytest.raises(ProviderError) as rejected:
            await denied.complete("hello")
        await denied.aclose()
        rejections.append(rejected.value)
    written = "".join(p.read_text() for p in sorted(tmp_path.glob("*.jsonl")))
    assert written.count('"ok":false') == 4  # both formats' FAIL400 and FAIL500 items
    assert [e.status for e in rejections] == [401, 401]
    leaks = _holding_the_key(tmp_path, []) + [
        f"the 401 ProviderError ({i})" for i, e in enumerate(rejections) if SECRET in str(e)
    ]
    assert not leaks, "the key was written to: " + "; ".join(leaks)


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Bearer sk-Unknown1234567890",
        '{"x-api-key": "sk-ant-Unknown1234567890"}',
        "{'x-goog-api-key': 'AIzaUnknown1234567890'}",
        "GET https://gw.example/v1/models?alt=sse&key=AIzaUnknown1234567890 failed",
        "OPENAI_API_KEY=sk-Unknown1234567890",
    ],
)
def test_a_credential_is_redacted_even_when_the_key_is_not_known(text: str) -> None:
    assert "Unknown1234567890" not in redact_text(text)


def test_redaction_reaches_any_depth_and_keeps_prose() -> None:
    value = {"error": [{"message": f"token {SECRET}"}, (f"x {SECRET}",)], "n": 3}
    assert redact(value, [SECRET]) == {"error": [{"message": "token ***"}, ("x ***",)], "n": 3}
    prose = "set OPENAI_API_KEY=... or send a Bearer token; api_key: missing"
    assert redact_text(prose) == prose
