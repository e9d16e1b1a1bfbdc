"""What ``mmirage run`` of a batch_api pipeline says when something goes wrong: one sentence
per problem, said once, never a raw errno or one line per chunk."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import yaml

from batch_spec_support import MMIRAGE, mmirage
from provider_emulator import EmulatorConfig, running_emulator
from test_batch_submit_interrupted import env_for, pipeline, stop_when_held

SUBMIT_FAILED = "submitting a batch to openai failed"


def files_under(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


def test_export_prompts_onto_a_file_is_one_sentence_and_writes_nothing(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(seed=21)) as emu:
        config = pipeline(tmp_path, emu, "openai", rows=20)
    in_the_way = tmp_path / "prompts.txt"
    in_the_way.write_text("not a directory\n")
    before = files_under(tmp_path)
    done = mmirage("run", config, "--export-prompts", in_the_way, env=env_for("openai"))
    assert done.code == 2, done
    assert done.err.splitlines() == done.error_lines, done  # the error and nothing else
    (line,) = done.error_lines
    assert str(in_the_way) in line and "directory" in line and "Errno" not in line, line
    assert files_under(tmp_path) == before


def test_export_prompts_onto_a_directory_named_like_the_export_is_one_sentence(
    tmp_path: Path,
) -> None:
    with running_emulator(EmulatorConfig(seed=22)) as emu:
        config = pipeline(tmp_path, emu, "openai", rows=20)
    (tmp_path / "prompts.abc123.jsonl").mkdir()  # where the run's export file would go
    env = env_for("openai")
    before = files_under(tmp_path)
    done = mmirage(
        "run", config, "--run-id", "abc123", "--export-prompts", tmp_path / "prompts.jsonl", env=env
    )
    assert done.code == 2, done
    assert done.err.splitlines() == done.error_lines, done
    (line,) = done.error_lines
    assert "prompts.abc123.jsonl is a directory" in line, line
    assert files_under(tmp_path) == before


def test_a_refused_submission_is_said_once(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(seed=23)) as emu:
        config = pipeline(tmp_path, emu, "openai", rows=100)
    data = yaml.safe_load(config.read_text())
    data["processors"][0]["base_url"] = "http://127.0.0.1:9/v1"  # nothing listens there
    config.write_text(yaml.safe_dump(data))
    done = mmirage("run", config, env=env_for("openai"))
    assert done.code == 1, done
    assert done.err.count(SUBMIT_FAILED) == 1, done
    assert "Traceback" not in done.err


def test_a_resumed_submission_logs_one_line_not_one_per_chunk(tmp_path: Path) -> None:
    slow = EmulatorConfig(seed=24, batch_create_delay_s=0.5)
    with running_emulator(slow, subprocess=True) as emu:
        config = pipeline(tmp_path, emu, "openai")  # 40 chunks
        env = env_for("openai")
        proc = subprocess.Popen([MMIRAGE, "run", str(config)], env=env, stderr=subprocess.DEVNULL)
        stop_when_held(proc, emu, "openai", 3, signal.SIGKILL)  # most chunks are left unsent
        resumed = mmirage("run", config, env=env, timeout=300)
    assert resumed.code == 0, resumed
    summaries = [line for line in resumed.err.splitlines() if "unsent chunk(s) of" in line]
    assert len(summaries) == 1, resumed
    unsent = int(summaries[0].split("resuming ", 1)[1].split()[0])
    assert unsent > 1, summaries  # several chunks, said in one line
    # No line per chunk file (a batch adopted from the killed run is named, and paid once).
    per_chunk = [line for line in resumed.err.splitlines() if "chunk-0" in line]
    assert all("adopted" in line for line in per_chunk), per_chunk
