"""The run value is worked out once per command: a real ``mmirage`` process per command, with
``rundir.pipeline_id`` and ``rundir.fingerprint`` counted (each a digest of the config)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from provider_emulator import EmulatorConfig, running_emulator
from test_batch_collector import KEY, config_data

COUNTING = """
import atexit, sys
import mmirage.rundir as rundir
counts = {"pipeline_id": 0, "fingerprint": 0}
for name in counts:
    def counted(config, _real=getattr(rundir, name), _name=name):
        counts[_name] += 1
        return _real(config)
    setattr(rundir, name, counted)
atexit.register(lambda: print("COUNTS", *counts.values(), file=sys.stderr, flush=True))
sys.argv = ["mmirage", *sys.argv[1:]]
from mmirage.cli import entry
entry()
"""


def counted(*args: str, cwd: Path) -> tuple[int, int, str]:
    """(pipeline ids, fingerprints) one ``mmirage ARGS`` process computed, and its stderr."""
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    done = subprocess.run(
        [sys.executable, "-c", COUNTING, *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    found = re.search(r"^COUNTS (\d+) (\d+)$", done.stderr, re.MULTILINE)
    assert found, done.stderr
    return int(found[1]), int(found[2]), done.stderr


@pytest.fixture(scope="module")
def emu() -> Any:
    with running_emulator(EmulatorConfig(seed=5)) as handle:
        yield handle


@pytest.mark.parametrize(
    "command",
    [
        ("run", "{config}"),
        ("run", "{config}", "--shard-id", "1"),
        ("check", "{config}"),
        ("merge", "{config}", "--output-path", "{tmp}/merged.jsonl"),
        ("retry", "{config}"),
        ("stats", "{config}"),
    ],
    ids=lambda c: " ".join(c[:1] + c[2:3]),
)
def test_one_command_works_out_the_pipeline_id_and_fingerprint_once(
    emu: Any, tmp_path: Path, command: tuple[str, ...]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(config_data(tmp_path, emu)))
    if command[0] != "run":
        assert counted("run", str(config), cwd=tmp_path)[2].count("Traceback") == 0
    args = [a.format(config=config, tmp=tmp_path) for a in command]
    pipeline_ids, fingerprints, stderr = counted(*args, cwd=tmp_path)
    assert "Traceback" not in stderr, stderr
    assert (pipeline_ids, fingerprints) == (1, 1), stderr
