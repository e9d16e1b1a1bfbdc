"""``batch_api`` against a server that has no batch API (issue 26, item 3): vLLM, llama.cpp's
``llama-server`` and llama-cpp-python answer 404 on ``/v1/files`` and ``/v1/batches``. The run
stops before any chunk is created, with one sentence: this server has no batch API; use an
``llm`` processor. Against the emulator in those servers' dialects, and against
llama-cpp-python's own server where it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from conftest import TEST_KEY
from llama_cpp_server_support import llama_cpp_python_server
from llm_kit import LLM, BatchItem, Message
from llm_kit.errors import NoBatchAPIError
from provider_emulator import EmulatorConfig, running_emulator

ROWS = 5


def write_config(tmp_path: Path, base_url: str) -> Path:
    data = tmp_path / "questions.jsonl"
    data.write_bytes(
        b"".join(orjson.dumps({"question": f"What is {i} + {i}?"}) + b"\n" for i in range(ROWS))
    )
    config = tmp_path / "batch.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            processors:
              - type: batch_api
                provider: openai
                model: smollm2
                base_url: {base_url}
                metadata_output_path: {tmp_path}/out/batch_meta.jsonl
            loading_params:
              state_dir: {tmp_path}/out/state
              datasets:
                - path: {data}
                  type: JSONL
                  output_dir: {tmp_path}/out/shards
            processing_params:
              inputs:
                - name: question
                  key: question
              outputs:
                - name: answer
                  type: batch_api
                  output_type: plain
                  prompt: "{{{{ question }}}}"
              output_schema:
                question: "{{{{ question }}}}"
                answer: "{{{{ answer }}}}"
            """
        )
    )
    return config


def mmirage_run(config: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": TEST_KEY}
    return subprocess.run(
        [sys.executable, "-m", "mmirage", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a bound on a hang, not a timing check
    )


def said_no_batch_api(result: subprocess.CompletedProcess[str], base_url: str) -> str:
    """The run's one line about it (asserted), without the shard's own prefix."""
    lines = [line for line in result.stderr.splitlines() if "has no batch API" in line]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert f"the server at {base_url} has no batch API" in line, line
    assert "use an llm processor" in line, line
    assert "does not know the upload" not in result.stderr, result.stderr
    return line


@pytest.mark.parametrize("server", ["vllm", "llama_server", "llama_cpp_python"])
def test_batch_api_to_a_server_without_one_stops_before_any_chunk_with_one_sentence(
    server: str, tmp_path: Path
) -> None:
    # Before: "openai does not know the upload of batch_chunk-s0-chunk-000001.jsonl (HTTP 404):
    # check that it belongs to this account (API key) and base URL; rerun to submit ..."
    with running_emulator(EmulatorConfig(dialect=server)) as emu:  # type: ignore[arg-type]
        result = mmirage_run(write_config(tmp_path, emu.openai_base_url))
        stats = emu.stats()
    assert result.returncode == 2, result.stderr  # the user's move: the config must change
    said_no_batch_api(result, emu.openai_base_url)
    assert not stats.get("batches")  # nothing created, nothing paid
    assert not list((tmp_path / "out").rglob("*receipt*.jsonl"))


async def test_llm_kit_says_so_before_creating_anything(tmp_path: Path) -> None:
    items = [BatchItem(f"q{i}", [Message.user(f"What is {i} + {i}?")]) for i in range(3)]
    with running_emulator(EmulatorConfig(dialect="vllm")) as emu:
        llm = LLM("smollm2", base_url=emu.openai_base_url, api_key=TEST_KEY)
        with pytest.raises(NoBatchAPIError) as info:
            await llm.submit_batch(items, spool_dir=tmp_path)
        assert not emu.stats().get("batches")
    assert str(info.value) == (
        f"the server at {emu.openai_base_url} has no batch API (POST /files answered HTTP "
        "404): send the requests live instead"
    )
    assert "\n" not in str(info.value)


def test_a_server_with_the_batch_api_still_takes_batch_api(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        result = mmirage_run(write_config(tmp_path, emu.openai_base_url))
        assert emu.stats().get("batches") == {"openai": 1}
    assert result.returncode == 0, result.stderr


# -- llama-cpp-python's own server (no model call is made: the upload is refused) -----------


@pytest.fixture(scope="module")
def real_llama_cpp_python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``python -m llama_cpp.server`` with SmolLM2-135M on 127.0.0.1; its base URL."""
    folder = tmp_path_factory.mktemp("llama_cpp_python")
    with llama_cpp_python_server(folder, n_ctx=512, alias="smollm2") as base_url:
        yield base_url


def test_the_real_llama_cpp_python_server_gets_the_same_sentence(
    real_llama_cpp_python: str, tmp_path: Path
) -> None:
    result = mmirage_run(write_config(tmp_path, real_llama_cpp_python))
    assert result.returncode == 2, result.stderr
    said_no_batch_api(result, real_llama_cpp_python)
