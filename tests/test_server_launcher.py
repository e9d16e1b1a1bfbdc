"""An ``llm`` processor with ``server_args.model_path`` and no ``base_url`` starts its own
SGLang/vLLM server and stops it afterwards, checked without a GPU.

Fake ``sglang`` and ``vllm`` packages (on ``sys.path`` here and on ``PYTHONPATH`` for child
processes) parse the engine's flags, record the argv they got, and serve the llm_kit emulator
on the given port, or crash at start, or never become ready, as a test asks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmirage.config.errors import ConfigError
from mmirage.config.processing_params import LLMOutput
from mmirage.config.processors import LLMProcessorConfig
from mmirage.config.validation import build
from mmirage.core.process.base import OutputRequest
from mmirage.core.process.factory import build_processor
from mmirage.core.process.llm_processor import LLMProcessor
from mmirage.core.process.server_launcher import (
    ENGINE_ENV,
    TIMEOUT_ENV,
    launch_server,
    server_command,
)

MODEL = "/models/Qwen3-0.6B"

FAKE_ENGINE = """\
import argparse, json, os, sys, time

ENGINE = {engine!r}
parser = argparse.ArgumentParser()
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, required=True)
args, _ = parser.parse_known_args()
record = os.environ["FAKE_ENGINE_RECORD"]
with open(record + ".tmp", "w") as f:
    json.dump({{"engine": ENGINE, "argv": sys.argv[1:], "pid": os.getpid()}}, f)
os.replace(record + ".tmp", record)
mode = os.environ.get("FAKE_ENGINE_MODE", "serve")
if mode == "crash":
    print("loading the model...", flush=True)
    print("RuntimeError: CUDA out of memory (fake)", file=sys.stderr, flush=True)
    sys.exit(3)
if mode == "hang":
    time.sleep(3600)
from provider_emulator.__main__ import main

latency = os.environ.get("FAKE_ENGINE_LATENCY")
extra = ["--latency", latency] if latency else []
sys.exit(main(["--host", args.host, "--port", str(args.port), *extra]))
"""

# Each engine's package tree and the module its server runs as.
ENGINE_FILES = {
    "sglang": ["sglang/__init__.py", "sglang/launch_server.py"],
    "vllm": [
        "vllm/__init__.py",
        "vllm/entrypoints/__init__.py",
        "vllm/entrypoints/openai/__init__.py",
        "vllm/entrypoints/openai/api_server.py",
    ],
}


@dataclass
class Fakes:
    site: Path  # the folder holding the fake packages
    record: Path  # what the last started fake engine wrote: engine, argv, pid

    def started(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.record.read_text())
        return data


def install_fakes(site: Path, engines: tuple[str, ...]) -> None:
    for engine in engines:
        for name in ENGINE_FILES[engine]:
            path = site / name
            path.parent.mkdir(parents=True, exist_ok=True)
            main = name.endswith(("launch_server.py", "api_server.py"))
            path.write_text(FAKE_ENGINE.format(engine=engine) if main else "")


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fakes]:
    """Both fake engines installed, for this process and its children; env knobs cleared."""
    site = tmp_path / "site"
    install_fakes(site, ("sglang", "vllm"))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), _pythonpath()])))
    record = tmp_path / "engine.json"
    monkeypatch.setenv("FAKE_ENGINE_RECORD", str(record))
    for name in (ENGINE_ENV, TIMEOUT_ENV, "FAKE_ENGINE_MODE", "FAKE_ENGINE_LATENCY"):
        monkeypatch.delenv(name, raising=False)
    yield Fakes(site, record)
    if record.exists():  # a failed test must not leave its fake server running
        pid = json.loads(record.read_text())["pid"]
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def _pythonpath() -> str:
    return os.environ.get("PYTHONPATH", "")


def llm_config(**raw: Any) -> LLMProcessorConfig:
    return build(LLMProcessorConfig, {"type": "llm", **raw}, ("processors", 0), "test.yaml")


def gone(pid: int) -> bool:
    """No such process, or only a zombie left (its parent died: nobody here may reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


# -- the command per engine ---------------------------------------------------------------------


def test_sglang_command_takes_every_server_arg_under_its_own_name() -> None:
    args = llm_config(
        server_args={
            "model_path": MODEL,
            "tp_size": 2,
            "trust_remote_code": True,
            "disable_custom_all_reduce": True,
            "extra_engine_args": {
                "mem_fraction_static": 0.8,
                "chat_template": "qwen2-vl",
                "enable_torch_compile": False,
                "port": 1,  # ours to choose: ignored
            },
        }
    ).server_args
    argv, ignored = server_command("sglang", args, port=4242, served_name="m", api_key="k")
    assert argv == [
        "-m", "sglang.launch_server", "--model-path", MODEL, "--host", "127.0.0.1",
        "--port", "4242", "--served-model-name", "m", "--api-key=k", "--tp-size", "2",
        "--trust-remote-code", "--disable-custom-all-reduce", "--mem-fraction-static", "0.8",
        "--chat-template", "qwen2-vl",
    ]  # fmt: skip
    assert ignored == ["port"]


def test_vllm_command_maps_sglang_names_and_ignores_the_rest() -> None:
    args = llm_config(
        server_args={
            "model_path": MODEL,
            "tp_size": 4,
            "trust_remote_code": False,
            "extra_engine_args": {
                "mem_fraction_static": 0.85,
                "chat_template": "/t.jinja",
                "context_length": 8192,
                "enable_torch_compile": True,
            },
        }
    ).server_args
    argv, ignored = server_command("vllm", args, port=4242, served_name="m", api_key="k")
    assert argv == [
        "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL, "--host", "127.0.0.1",
        "--port", "4242", "--served-model-name", "m", "--api-key=k",
        "--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.85",
        "--chat-template", "/t.jinja", "--max-model-len", "8192",
    ]  # fmt: skip
    assert ignored == ["enable_torch_compile"]


# -- launching, in this process ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("hidden", "forced", "engine", "module"),
    [
        (None, None, "sglang", "sglang.launch_server"),  # both installed: SGLang first
        ("sglang", None, "vllm", "vllm.entrypoints.openai.api_server"),
        (None, "vllm", "vllm", "vllm.entrypoints.openai.api_server"),
    ],
)
async def test_processor_starts_the_engine_serves_rows_and_stops_it(
    fakes: Fakes,
    monkeypatch: pytest.MonkeyPatch,
    hidden: str | None,
    forced: str | None,
    engine: str,
    module: str,
) -> None:
    if hidden:
        monkeypatch.setattr("importlib.util.find_spec", _find_spec_without(hidden))
    if forced:
        monkeypatch.setenv(ENGINE_ENV, forced)
    config = llm_config(name="gen", model="served", server_args={"model_path": MODEL, "tp_size": 1})
    processor = build_processor(config)
    assert isinstance(processor, LLMProcessor) and processor.server is not None
    started = fakes.started()
    assert started["engine"] == engine
    assert started["argv"][:2] == ["--model-path" if engine == "sglang" else "--model", MODEL]
    assert "--served-model-name" in started["argv"] and "served" in started["argv"]
    assert processor.llm.base_url == processor.server.base_url
    assert processor.server.log_path.read_text().startswith(f"$ python -m {module} ")
    assert processor.server.api_key not in processor.server.log_path.read_text()
    try:
        output = LLMOutput(name="caption", prompt="{{ text }}")
        request = OutputRequest(row_key="0::0", output_name="caption", prompt="hello")
        results = await processor.process(output, [request])
    finally:
        await processor.aclose()
    assert [r.value for r in results] == ["echo: hello"]
    assert gone(started["pid"])


def _find_spec_without(missing: str) -> Any:
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == missing else real(name, package)

    return find_spec


def test_log_goes_to_the_given_folder(tmp_path: Path, fakes: Fakes) -> None:
    server = launch_server(llm_config(server_args={"model_path": MODEL}), tmp_path / "shard_0")
    try:
        assert server.log_path == tmp_path / "shard_0" / "llm-server-llm.log"
        assert server.served_name == MODEL  # no model: the path is the served name
    finally:
        server.stop()
    assert gone(fakes.started()["pid"])


def test_a_server_that_exits_at_start_fails_at_once_naming_its_log(
    fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ENGINE_MODE", "crash")
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        build_processor(llm_config(name="gen", server_args={"model_path": MODEL}))
    message = str(info.value)
    assert time.monotonic() - started < 15
    assert "the SGLang server started for this shard exited with code 3" in message
    assert "its log is " in message and "llm-server-gen-" in message
    assert "CUDA out of memory (fake)" in message
    assert "\n" not in message


def test_a_server_never_ready_times_out(fakes: Fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ENGINE_MODE", "hang")
    monkeypatch.setenv(TIMEOUT_ENV, "1.5")
    with pytest.raises(ConfigError, match=r"did not answer GET /v1/models within 1.5s") as info:
        build_processor(llm_config(server_args={"model_path": MODEL}))
    assert TIMEOUT_ENV in str(info.value) and "its log is " in str(info.value)
    assert wait_gone(fakes.started()["pid"])


def test_nothing_installed_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, package=None: None)
    with pytest.raises(ConfigError) as info:
        build_processor(llm_config(server_args={"model_path": MODEL}))
    message = str(info.value)
    assert "server_args.model_path" in message
    assert "needs a server engine (SGLang or vLLM), which is not installed here" in message
    assert "vllm" in message and "base_url" in message  # the package for this machine: elsewhere


def test_a_forced_engine_must_be_installed_and_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, package=None: None)
    monkeypatch.setenv(ENGINE_ENV, "vllm")
    with pytest.raises(ConfigError, match=rf"{ENGINE_ENV}=vllm but vLLM is not installed"):
        build_processor(llm_config(server_args={"model_path": MODEL}))
    monkeypatch.setenv(ENGINE_ENV, "tgi")
    with pytest.raises(ConfigError, match="names no server engine; use sglang or vllm"):
        build_processor(llm_config(server_args={"model_path": MODEL}))


def test_base_url_or_message_format_never_launches(fakes: Fakes) -> None:
    config = llm_config(base_url="http://127.0.0.1:1/v1", server_args={"model_path": MODEL})
    assert isinstance(build_processor(config), LLMProcessor)
    assert not fakes.record.exists()


# -- through `mmirage run` ---------------------------------------------------------------------

ROWS = [{"text": "alpha"}, {"text": "beta"}, {"text": "gamma"}]


def run_dir(root: Path) -> Path:
    root.mkdir(exist_ok=True)
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = {
        "processors": [{"type": "llm", "server_args": {"model_path": MODEL, "tp_size": 1}}],
        "loading_params": {
            "state_dir": "state",
            "datasets": [{"path": "data.jsonl", "type": "JSONL", "output_dir": "out"}],
            "batch_size": 2,
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


def mmirage_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mmirage", *args]


def published_rows(root: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in sorted((root / "out").rglob("*.jsonl"))
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def test_mmirage_run_produces_rows_through_the_launched_server(
    tmp_path: Path, fakes: Fakes
) -> None:
    root = run_dir(tmp_path / "run")
    done = subprocess.run(
        mmirage_argv("run", "pipeline.yaml"), cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    rows = published_rows(root)
    assert sorted(r["said"] for r in rows) == [f"echo: Say {r['text']}" for r in ROWS]
    assert wait_gone(fakes.started()["pid"], 2)


def test_a_killed_run_leaves_no_server_behind(
    tmp_path: Path, fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ENGINE_LATENCY", "60")  # rows hang: the run is busy when killed
    root = run_dir(tmp_path / "run")
    run = subprocess.Popen(
        mmirage_argv("run", "pipeline.yaml"),
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not (fakes.record.exists() and _serving(root)) and time.monotonic() < deadline:
            assert run.poll() is None, "the run ended before its server was up"
            time.sleep(0.1)
        pid = fakes.started()["pid"]
        assert not gone(pid)
        run.send_signal(signal.SIGKILL)
        run.wait(10)
        assert wait_gone(pid, 15), "the server outlived the killed run"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()


def _serving(root: Path) -> bool:
    """The shard has started rows: its server answered (the status says running)."""
    for path in (root / "state").rglob("status.json"):
        try:
            if json.loads(path.read_text()).get("status") == "running":
                return True
        except ValueError:
            pass  # caught mid-write
    return False


def test_mmirage_run_with_a_server_that_crashes_exits_2_naming_the_log(
    tmp_path: Path, fakes: Fakes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ENGINE_MODE", "crash")
    root = run_dir(tmp_path / "run")
    done = subprocess.run(
        mmirage_argv("run", "pipeline.yaml"), cwd=root, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "exited with code 3 before it was ready; its log is " in lines[0]
    log_path = lines[0].split("its log is ", 1)[1].split(";", 1)[0]
    assert "CUDA out of memory (fake)" in Path(log_path).read_text()
