"""The Batch API page, end to end and offline: configs/batch_config.yaml against our emulator.

Starts the provider emulator (batches take a few seconds, as real ones take hours), then runs
the three steps of the page as a user would type them:

    mmirage run   --config configs/batch_config.yaml          # submit, exit
    mmirage check --config configs/batch_config.yaml --wait   # follow the batches
    mmirage merge --config configs/batch_config.yaml --output-path out/batch_api/merged.jsonl

and prints two merged rows. Pass --provider anthropic for configs/config_mock_anthropic_batch.yaml.
Run from the repository root: .venv/bin/python examples/batch_api/run.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

MMIRAGE = str(Path(sys.executable).with_name("mmirage"))
SETUPS = {
    "openai": ("configs/batch_config.yaml", "OPENAI", "/v1"),
    "anthropic": ("configs/config_mock_anthropic_batch.yaml", "ANTHROPIC", ""),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until_up(url: str, process: subprocess.Popen[bytes]) -> None:
    for _ in range(100):
        if process.poll() is not None:
            sys.exit("the emulator did not start")
        try:
            urllib.request.urlopen(url, timeout=1)  # any answer means it is listening
            return
        except OSError as exc:
            if getattr(exc, "code", None):  # an HTTP error is an answer
                return
            time.sleep(0.1)
    sys.exit("the emulator did not answer")


def step(argv: list[str], env: dict[str, str]) -> None:
    print(f"\n$ mmirage {' '.join(argv)}", flush=True)
    code = subprocess.run([MMIRAGE, *argv], env=env).returncode
    if code != 0:
        sys.exit(f"mmirage {argv[0]} exited with {code}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=sorted(SETUPS), default="openai")
    args = parser.parse_args()
    config, prefix, path = SETUPS[args.provider]
    out = Path(f"out/batch_api_{args.provider}")
    shutil.rmtree(out, ignore_errors=True)  # receipts of an earlier emulator mean nothing now
    port = free_port()
    env = {
        **os.environ,
        f"{prefix}_API_KEY": "sk-emulator-not-a-secret",
        f"{prefix}_BASE_URL": f"http://127.0.0.1:{port}{path}",
        "MMIRAGE_BATCH_OUT": str(out),
    }
    emulator = subprocess.Popen(
        [MMIRAGE, "emulate", "--port", str(port), "--batch-delay", "3"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/", emulator)
        merged = out / "merged.jsonl"
        step(["run", "--config", config], env)
        step(["check", "--config", config], env)
        step(["check", "--config", config, "--wait", "--poll-interval", "1"], env)
        step(["merge", "--config", config, "--output-path", str(merged)], env)
    finally:
        emulator.terminate()
        emulator.wait()
    rows = [json.loads(line) for line in merged.read_text().splitlines()]
    print(f"\n{len(rows)} rows in {merged}; two of them:")
    for row in rows[:2]:
        print(json.dumps(row, indent=2))


if __name__ == "__main__":
    main()
