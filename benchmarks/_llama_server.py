"""Find or build llama.cpp's own ``llama-server`` for a side-by-side benchmark.

Looked for in ``$LLAMA_SERVER``, on ``PATH``, then in ``~/.cache/llm_kit/llama-server/``.
Otherwise built once from the llama.cpp sources that the installed llama-cpp-python's sdist
vendors (``pip download``, then cmake, ``GGML_NATIVE=OFF``: a native build dies with SIGILL
on CPUs that list AMX) and cached there. Nothing in mmirage depends on it; where it cannot be
found or built, the caller skips the comparison and says why.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

CACHE = Path.home() / ".cache" / "llm_kit" / "llama-server"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary to cache
]


def find_or_build(log: Path) -> tuple[Path | None, str]:
    """(the binary, how it was found) or (None, why not)."""
    for candidate, how in (
        (os.environ.get("LLAMA_SERVER"), "from $LLAMA_SERVER"),
        (shutil.which("llama-server"), "on PATH"),
        (str(CACHE / "llama-server"), f"cached in {CACHE}"),
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate), how
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            return None, f"no {tool} to build llama-server with"
    try:
        return _build(log), f"built from llama-cpp-python's vendored llama.cpp into {CACHE}"
    except (subprocess.CalledProcessError, OSError, StopIteration) as exc:
        return None, f"building llama-server failed ({exc}); see {log}"


def _build(log: Path) -> Path:
    version = importlib.metadata.version("llama-cpp-python")
    with tempfile.TemporaryDirectory() as tmp, log.open("w") as out:
        print(f"building llama-server from llama-cpp-python {version}'s sources (minutes)...")
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        subprocess.run(
            [*pip, f"llama-cpp-python=={version}", "-d", tmp], check=True, stdout=out, stderr=out
        )
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        source = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        build = Path(tmp) / "build"
        subprocess.run(
            ["cmake", "-S", str(source), "-B", str(build), *CMAKE_FLAGS],
            check=True,
            stdout=out,
            stderr=out,
        )
        jobs = str(len(os.sched_getaffinity(0)))
        subprocess.run(
            ["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs],
            check=True,
            stdout=out,
            stderr=out,
        )
        CACHE.mkdir(parents=True, exist_ok=True)
        for built in (build / "bin").iterdir():  # the binary and the shared libraries it needs
            shutil.copy2(built, CACHE / built.name)
    return CACHE / "llama-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(
    binary: Path, gguf: Path, slots: int, n_ctx: int, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """Start llama-server (``slots`` parallel slots of ``n_ctx`` tokens each); wait until ready."""
    port = free_port()
    argv = [
        str(binary),
        "-m",
        str(gguf),
        "--alias",
        "smollm2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-np",
        str(slots),
        "-c",
        str(slots * n_ctx),
        "-t",
        str(len(os.sched_getaffinity(0))),
    ]
    env = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
                if reply.status == 200:
                    return proc, f"{url}/v1"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"llama-server did not become ready in 120 s; see {log}")
