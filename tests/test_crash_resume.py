"""kill -9 at random moments during a 20k-item batch_to_jsonl, resume each time."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from provider_emulator import EmulatorConfig, running_emulator

TOTAL = 20_000
WORKER = Path(__file__).with_name("crash_worker.py")


def line_count(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_kill_9_ten_times_then_resume_gives_every_id_exactly_once(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    rng = random.Random(1234)
    # A little latency stretches the run so that kills land mid-flight, not after the end.
    with running_emulator(EmulatorConfig(latency_s=0.01), subprocess=True) as emu:
        command = [sys.executable, str(WORKER), emu.openai_base_url, str(out), str(TOTAL)]
        kills = 0
        while kills < 10:
            before = line_count(out)
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            # Wait until this run has written something new, then kill at a random moment.
            deadline = time.monotonic() + 60
            while line_count(out) <= before and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.4))
            if proc.poll() is not None:
                break  # it finished before we could kill it: the rest of the test still holds
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            kills += 1
        final = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert final.returncode == 0, final.stderr
    assert kills >= 5, "the run was too fast to be killed mid-flight"
    data = out.read_bytes()
    assert data.endswith(b"\n")
    ids: list[Any] = [orjson.loads(line)["id"] for line in data.splitlines()]  # no torn line
    assert len(ids) == TOTAL
    assert len(set(ids)) == TOTAL
    assert set(ids) == {f"id-{i:05d}" for i in range(TOTAL)}
