"""A fixed-answer OpenAI-compatible server in C (nginx), so that the server costs ~nothing.

``fixed_answer_server()`` starts nginx on 127.0.0.1 with a temporary config whose
``/v1/chat/completions`` returns one fixed chat completion, and stops it on exit. Without nginx
it yields the emulator (in its own process) instead, and says so.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson

_ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A one-line summary of the row."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
    }
).decode()

_CONFIG = """
worker_processes 1;
error_log {root}/error.log warn;
pid {root}/nginx.pid;
daemon off;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    server {{
        listen 127.0.0.1:{port};
        location /v1/chat/completions {{
            default_type application/json;
            return 200 '{answer}';
        }}
    }}
}}
"""

INSTALL_HINT = "install nginx for a server that costs nothing: apt-get install -y nginx-light"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, proc: subprocess.Popen[bytes], root: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited: {(root / 'error.log').read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nginx did not start listening within 10 s")


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )


@contextmanager
def nginx_server(binary: str) -> Iterator[str]:
    """The OpenAI base URL of a running nginx with the fixed answer."""
    with tempfile.TemporaryDirectory(prefix="bench-nginx-") as tmp:
        root, port = Path(tmp), _free_port()
        conf = root / "nginx.conf"
        conf.write_text(_CONFIG.format(root=root, port=port, answer=_ANSWER))
        proc = subprocess.Popen(
            [binary, "-p", str(root), "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            _wait_listening(port, proc, root)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@contextmanager
def fixed_answer_server() -> Iterator[tuple[str, str]]:
    """(base URL, what serves it): nginx when installed, else the emulator in its own process."""
    binary = nginx_binary()
    if binary is not None:
        with nginx_server(binary) as url:
            yield url, "nginx (fixed answer)"
        return
    print(f"nginx not found - {INSTALL_HINT}; falling back to the emulator", flush=True)
    from provider_emulator import EmulatorConfig, running_emulator

    with running_emulator(EmulatorConfig(), subprocess=True) as emu:
        yield emu.openai_base_url, "llm_kit emulator (fallback: nginx not installed)"
