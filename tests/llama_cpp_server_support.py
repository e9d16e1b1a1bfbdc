"""llama-cpp-python's own OpenAI-compatible server on the embedded model, for tests that must
meet a real third-party server (``python -m llama_cpp.server``, from the dev extra)."""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_kit.local import default_model_path

HAS_LLAMA_SERVER = all(
    importlib.util.find_spec(name) is not None for name in ("llama_cpp", "fastapi", "uvicorn")
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def llama_cpp_python_server(
    folder: Path, *, n_ctx: int = 1024, alias: str | None = None
) -> Iterator[str]:
    """The server on 127.0.0.1 (its log in ``folder``) until the block ends; its base URL.
    Skips the test where the dev extra's server is not installed."""
    if not HAS_LLAMA_SERVER:
        pytest.skip("needs `pip install 'llama-cpp-python[server]'` (the dev extra)")
    port = _free_port()
    log = folder / "server.log"
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(default_model_path())]
    if alias is not None:
        argv += ["--model_alias", alias]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    argv += ["--n_ctx", str(n_ctx), "--verbose", "False"]
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120  # a bound on a hung start, not a timing check
        while True:
            with contextlib.suppress(OSError):
                urllib.request.urlopen(base_url + "/models", timeout=1).close()
                break
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.25)
        yield base_url
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
