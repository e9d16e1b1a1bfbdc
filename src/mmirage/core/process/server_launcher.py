"""Start an SGLang or vLLM server for an ``llm`` processor that names ``server_args.model_path``
but no ``base_url``, and stop it when the processor closes.

Why a server and not an in-process ``sgl.Engine``: llm_kit already speaks to any
OpenAI-compatible endpoint, so a launched server gets the same pipeline (rate limits, retries,
one error per failed row) as a hosted API, and a server in its own process group can be stopped
whole, GPU workers included. Which engine, in which interpreter: ``engine_location``.
``MMIRAGE_LLM_SERVER_TIMEOUT`` (seconds, default 600) bounds the wait for ``GET /v1/models`` to
answer 200.

A GPU server must never outlive its shard: it is stopped on ``stop()`` (SIGTERM to its group,
SIGKILL after a grace period), at interpreter exit, and, when the shard is killed outright, by
the kernel (``PR_SET_PDEATHSIG``, set in a small trampoline before the engine is exec'd, so no
``preexec_fn`` runs in a process that may have threads).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmirage.config.errors import ConfigError
from mmirage.core.process.engine_location import ENGINE_ENV, ENGINES, find_engine, load_hint

if TYPE_CHECKING:
    from mmirage.config.processors import LLMProcessorConfig, ServerArgs

log = logging.getLogger(__name__)

TIMEOUT_ENV = "MMIRAGE_LLM_SERVER_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0  # a large model's first load (weights from disk, CUDA graphs) is slow
STOP_GRACE_S = 15.0  # SIGTERM lets the engine free the GPU cleanly; past this, SIGKILL
_POLL_S = 0.5
_TAIL_LINES = 5
_HOST = "127.0.0.1"  # never reachable from another machine

_SGLANG_MODULE = "sglang.launch_server"
_VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# ServerArgs and extra_engine_args use SGLang's names (existing configs name sgl.Engine's args);
# vLLM gets the ones it has an equivalent for, under its own flag. The rest are logged ignored.
_VLLM_FLAGS = {
    "tp_size": "--tensor-parallel-size",
    "dp_size": "--data-parallel-size",
    "trust_remote_code": "--trust-remote-code",
    "disable_custom_all_reduce": "--disable-custom-all-reduce",
    "mem_fraction_static": "--gpu-memory-utilization",
    "context_length": "--max-model-len",
    "max_running_requests": "--max-num-seqs",
    "chat_template": "--chat-template",
    "dtype": "--dtype",
    "quantization": "--quantization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "tokenizer_path": "--tokenizer",
    "revision": "--revision",
    "random_seed": "--seed",
    "download_dir": "--download-dir",
}
# Set by the launcher itself: a value for these in extra_engine_args would break the wiring.
_OWNED = {"model_path", "model", "host", "port", "api_key", "served_model_name"}

# Runs first in the server's process: die with the shard (even by SIGKILL), then exec the engine's
# interpreter (argv[2], maybe another venv's). The working directory is not importable: -P here,
# PYTHONSAFEPATH for the engine (an older interpreter ignores the variable; it refuses -P).
_TRAMPOLINE = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass  # not Linux: stop() and atexit still stop the server
if os.getppid() != int(sys.argv[1]):  # the shard died before prctl took effect
    sys.exit(1)
os.execve(sys.argv[2], sys.argv[2:], {**os.environ, "PYTHONSAFEPATH": "1"})
"""


def wants_server(config: LLMProcessorConfig) -> bool:
    """A model path and nowhere else to send requests: the shard must start a server. An
    explicit ``message_format`` means that provider (or the embedded model), never a launch."""
    return (
        not config.base_url
        and not config.message_format
        and config.server_args.model_path not in ("", "none")
    )


def server_command(
    engine: str, server_args: ServerArgs, *, port: int, served_name: str, api_key: str
) -> tuple[list[str], list[str]]:
    """The engine's argv after ``python`` (``-m MODULE ...``), and the server_args names it
    does not take. ``extra_engine_args`` override the named fields, as in the original."""
    values: dict[str, Any] = {
        "tp_size": server_args.tp_size,
        "trust_remote_code": server_args.trust_remote_code,
        "disable_custom_all_reduce": server_args.disable_custom_all_reduce,
        **server_args.extra_engine_args,
    }
    model_flag, module = (
        ("--model-path", _SGLANG_MODULE) if engine == "sglang" else ("--model", _VLLM_MODULE)
    )
    argv = ["-m", module, model_flag, server_args.model_path, "--host", _HOST, "--port", str(port)]
    # One word: a key may start with "-", which argparse would take for an option.
    argv += ["--served-model-name", served_name, f"--api-key={api_key}"]
    ignored: list[str] = []
    for name, value in values.items():
        if name in _OWNED:
            ignored.append(name)
            continue
        if engine == "sglang":
            flag = "--" + name.replace("_", "-")
        elif name in _VLLM_FLAGS:
            flag = _VLLM_FLAGS[name]
        else:
            ignored.append(name)
            continue
        argv += _flag(flag, value)
    return argv, ignored


def _flag(flag: str, value: Any) -> list[str]:
    """One option: a true bool is a bare flag, false or None leaves the engine's default."""
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, list | tuple):
        return [flag, *(str(v) for v in value)]
    if isinstance(value, dict):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def _timeout_s(source: str) -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ConfigError(
            source, "server_args.model_path", f"{TIMEOUT_ENV}={raw!r} must be a number of seconds"
        )
    return value


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class LaunchedServer:
    """A running engine: where llm_kit reaches it, and how to stop it."""

    engine: str
    source: str  # "processor 'name'", for errors
    port: int
    served_name: str
    api_key: str
    log_path: Path
    process: subprocess.Popen[bytes]
    command: str = ""  # for messages; the API key masked
    hint: str = ""  # why this engine may die at start with this model, said if it does
    _stopped: bool = field(default=False, repr=False)

    @property
    def base_url(self) -> str:
        return f"http://{_HOST}:{self.port}/v1"

    def wait_ready(self, timeout_s: float) -> None:
        """Block until ``GET /v1/models`` answers 200; raise one sentence if the server exits
        first or is not ready in time (the caller stops it)."""
        deadline = time.monotonic() + timeout_s
        request = urllib.request.Request(
            self.base_url + "/models", headers={"Authorization": f"Bearer {self.api_key}"}
        )
        while True:
            code = self.process.poll()
            if code is not None:
                hint = f" ({self.hint})" if self.hint else ""
                raise self._error(f"exited with code {code} before it was ready{hint}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._error(
                    f"did not answer GET /v1/models within {timeout_s:g}s (set {TIMEOUT_ENV} "
                    "to wait longer)"
                )
            try:
                with urllib.request.urlopen(request, timeout=min(5.0, remaining)) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass  # not listening yet, or still loading the model
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def _error(self, what: str) -> ConfigError:
        tail = _tail(self.log_path)
        said = f"; it last said: {tail}" if tail else ""
        return ConfigError(
            self.source,
            "server_args.model_path",
            f"the {ENGINES[self.engine]} server started for this shard {what}; its log is "
            f"{self.log_path}{said}",
        )

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``STOP_GRACE_S``; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        group = self.process.pid  # its own session: the group id is its pid
        if self.process.poll() is None:
            _signal_group(group, signal.SIGTERM)
            try:
                self.process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                log.warning("%s: the server ignored SIGTERM; killing it", self.source)
        # Whatever of the group is left (engine workers holding GPU memory) goes now.
        _signal_group(group, signal.SIGKILL)
        self.process.wait()
        log.info("%s: %s server stopped", self.source, ENGINES[self.engine])


def _signal_group(group: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, sig)


def _tail(path: Path) -> str:
    """The log's last few non-empty lines on one line (the reason is usually there)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()][-_TAIL_LINES:]
    joined = " | ".join(lines)
    return joined if len(joined) <= 600 else "..." + joined[-600:]


def _log_file(log_dir: Path | None, name: str) -> tuple[Path, Any]:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or "llm"
    if log_dir is not None:
        with contextlib.suppress(OSError):
            log_dir.mkdir(parents=True, exist_ok=True)
            path = log_dir / f"llm-server-{safe}.log"
            return path, path.open("wb")
    fd, raw = tempfile.mkstemp(prefix=f"mmirage-llm-server-{safe}-", suffix=".log")
    return Path(raw), os.fdopen(fd, "wb")


def launch_server(config: LLMProcessorConfig, log_dir: Path | None = None) -> LaunchedServer:
    """Start the engine for ``config`` on a free local port and wait until it serves; the
    server's output goes to a log file under ``log_dir`` (else a temp dir) named in every
    error. Raises ``ConfigError`` (nothing installed, exited at start, not ready in time)."""
    source = f"processor '{config.name or config.type}'"
    location = find_engine(source, config.server_args)
    engine = location.engine
    timeout_s = _timeout_s(source)
    port, api_key = _free_port(), secrets.token_urlsafe(24)
    argv, ignored = server_command(
        engine, config.server_args, port=port, served_name=config.model_name, api_key=api_key
    )
    if ignored:
        log.warning("%s: %s does not take server_args %s; ignored", source, location.name, ignored)
    shown = " ".join([location.shown, *argv]).replace(api_key, "***")
    log_path, log_file = _log_file(log_dir, config.name or config.type)
    with log_file:
        log_file.write(f"$ {shown}\n".encode())
        log_file.flush()
        process = subprocess.Popen(
            [sys.executable, "-P", "-c", _TRAMPOLINE, str(os.getpid()), location.python, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stop() reaches the engine's workers too
        )
    hint = load_hint(engine, config.server_args.model_path)
    server = LaunchedServer(
        engine, source, port, config.model_name, api_key, log_path, process, shown, hint
    )
    atexit.register(server.stop)
    log.info("%s: starting %s on port %d (log: %s): %s", source, engine, port, log_path, shown)
    try:
        server.wait_ready(timeout_s)
    except BaseException:  # not ready, or the shard was stopped while waiting
        server.stop()
        raise
    log.info("%s: %s server ready at %s", source, ENGINES[engine], server.base_url)
    return server


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENGINE_ENV",
    "TIMEOUT_ENV",
    "LaunchedServer",
    "launch_server",
    "server_command",
    "wants_server",
]
