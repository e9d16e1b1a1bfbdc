"""One error handler maps every known error to its exit code; one registry maps every
``execution_params.mode`` to its executor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import typing
from pathlib import Path

import pytest
import yaml

from llm_kit.errors import ConfigError as KitConfigError
from llm_kit.errors import LLMKitError
from mmirage.cli import INTERRUPTED
from mmirage.cli.errors import code_of, exit_code_for, exit_on_errors, user_errors_exit_2
from mmirage.config import ConfigError
from mmirage.core.merge.shards import MergeError
from mmirage.errors import UserError, WorkFailed
from provider_emulator import EmulatorConfig, running_emulator

MMIRAGE = Path(sys.executable).with_name("mmirage")
PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("c.yaml", "processors", "is empty"), 2),
        (UserError("fix it"), 2),
        (KitConfigError("OPENAI_API_KEY is not set"), 2),
        (MergeError("shards missing"), 1),
        (WorkFailed("it failed"), 1),
        (LLMKitError("the provider said no"), 1),
        (ValueError("a bug"), None),
    ],
)
def test_each_error_has_one_exit_code(error: Exception, code: int | None) -> None:
    assert exit_code_for(error) == code


def test_the_handler_prints_one_sentence_and_exits_with_the_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped, exit_on_errors():
        raise WorkFailed("2 of 4 shard(s) did not succeed: [1, 3]")
    assert stopped.value.code == 1
    assert capsys.readouterr().err == "error: 2 of 4 shard(s) did not succeed: [1, 3]\n"
    with pytest.raises(ValueError), exit_on_errors():  # a bug is not dressed up as a sentence
        raise ValueError("a bug")


def test_only_user_errors_end_a_shard_run_early() -> None:
    with pytest.raises(SystemExit) as stopped, user_errors_exit_2():
        raise UserError("a missing key")
    assert stopped.value.code == 2
    with pytest.raises(WorkFailed), user_errors_exit_2():  # the caller retries the shard
        raise WorkFailed("a failed attempt")


def test_batch_mode_functions_return_the_code_instead_of_exiting() -> None:
    def failing() -> int:
        raise UserError("no key")

    assert code_of(failing) == 2
    assert code_of(lambda: 0) == 0


def test_every_mode_of_the_config_has_an_executor() -> None:
    from mmirage.config.execution import ExecutionParams
    from mmirage.executors.registry import EXECUTORS

    modes = typing.get_args(typing.get_type_hints(ExecutionParams)["mode"])
    assert set(modes) == set(EXECUTORS)


def test_ctrl_c_says_in_one_sentence_that_the_run_goes_on_when_run_again(tmp_path: Path) -> None:
    # Not click's bare "Aborted!": the sentence the troubleshooting page quotes, exit code 1,
    # and the same command then finishes the shard from its checkpoint.
    rows = 400
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(rows)))
    slow = EmulatorConfig(latency_s=0.02)
    with running_emulator(slow, subprocess=True) as emu:
        config = tmp_path / "c.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "processors": [
                        {
                            "type": "llm",
                            "base_url": emu.openai_base_url,
                            "model": "m",
                            "worker_concurrency": 4,
                        }
                    ],
                    "loading_params": {
                        "datasets": [
                            {
                                "path": str(data),
                                "type": "JSONL",
                                "output_dir": str(tmp_path / "out"),
                            }
                        ],
                        "output_format": "jsonl",
                        "state_dir": str(tmp_path / "state"),
                    },
                    "processing_params": {
                        "inputs": [{"name": "text", "key": "text"}],
                        "outputs": [{"name": "answer", "type": "llm", "prompt": "{{ text }}"}],
                        "output_schema": {"answer": "{{ answer }}"},
                    },
                }
            )
        )
        env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
        run = subprocess.Popen(
            [str(MMIRAGE), "run", str(config)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        part = tmp_path / "out" / ".parts" / "shard-0-of-1.ckpt.json"
        deadline = time.monotonic() + 60
        while not part.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the first group is checkpointed: the run is under way
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=120)
        assert run.returncode == 130, stderr  # 128 + SIGINT, after the graceful stop
        last = stderr.splitlines()[-1]
        assert last.startswith("interrupted by SIGINT: "), stderr
        assert last.endswith("run the same command again to go on"), stderr
        # A Ctrl-C while the config loads still says INTERRUPTED, and the page quotes it.
        assert f"`{INTERRUPTED}`" in PAGE.read_text()
        again = subprocess.run(
            [str(MMIRAGE), "run", str(config)], env=env, capture_output=True, text=True
        )
    assert again.returncode == 0, again.stderr
    assert "resuming" in again.stderr or "done" in again.stderr
    published = (tmp_path / "out" / "shard-0-of-1.jsonl").read_text().splitlines()
    assert [json.loads(line)["answer"] for line in published] == [
        f"echo: row {i}" for i in range(rows)
    ]
