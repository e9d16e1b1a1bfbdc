"""Run the recipes of examples/recipes/ offline, against our provider emulator.

Starts `mmirage emulate` on a free port, points the recipes at it (OPENAI_BASE_URL, and a
dummy OPENAI_API_KEY: the emulator wants a key, any key), then for each recipe runs

    mmirage run examples/recipes/<name>.yaml

and prints where its output is and one of its rows. Name recipes to run only those:

    .venv/bin/python examples/recipes/run.py [RECIPE ...]

RECIPE: openai_compatible, structured_json, images, custom_function (default: all, in order).

Outputs: out/recipes/<name>/data/shard-0-of-1.jsonl (wiped first, so every run computes again).
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]  # the configs' relative paths start at the repository root
_SCRIPT = Path(sys.executable).with_name("mmirage")  # the CLI of this Python's environment
MMIRAGE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "mmirage"]
RECIPES = ("openai_compatible", "structured_json", "images", "custom_function")


def output_of(name: str) -> Path:
    """Where a recipe's single shard lands (output_dir + output_format: jsonl in its config)."""
    return ROOT / "out" / "recipes" / name / "data" / "shard-0-of-1.jsonl"


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
            if getattr(exc, "code", None):  # an HTTP error is an answer too
                return
            time.sleep(0.1)
    sys.exit("the emulator did not answer")


def run_recipe(name: str, env: dict[str, str]) -> None:
    # A finished shard is skipped on rerun (that is how resuming works): start from nothing so
    # the demo really calls the model.
    shutil.rmtree(ROOT / "out" / "recipes" / name, ignore_errors=True)
    config = f"examples/recipes/{name}.yaml"
    print(f"\n$ mmirage run {config}", flush=True)
    code = subprocess.run([*MMIRAGE, "run", config], cwd=ROOT, env=env).returncode
    if code != 0:
        sys.exit(f"recipe {name}: mmirage run exited with {code}")
    path = output_of(name)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(f"{len(rows)} rows in {path.relative_to(ROOT)}; the first:")
    print(json.dumps(rows[0], indent=2, ensure_ascii=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", metavar="RECIPE", help=", ".join(RECIPES))
    args = parser.parse_args()
    unknown = sorted(set(args.recipes) - set(RECIPES))
    if unknown:
        parser.error(f"unknown recipe(s) {unknown}; choose from {', '.join(RECIPES)}")
    port = free_port()
    env = {
        **os.environ,
        # Replace, not default: this script always talks to its own emulator.
        "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
        "OPENAI_API_KEY": "sk-emulator-not-a-secret",
    }
    emulator = subprocess.Popen(
        [*MMIRAGE, "emulate", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/", emulator)
        # `mmirage check` of a recipe reads its config the same way: with this variable.
        print(f"OPENAI_BASE_URL={env['OPENAI_BASE_URL']}", flush=True)
        for name in args.recipes or RECIPES:
            run_recipe(name, env)
    finally:
        emulator.terminate()
        emulator.wait()


if __name__ == "__main__":
    main()
