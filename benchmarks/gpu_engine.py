"""On a GPU machine with vLLM or SGLang: ``mmirage run``'s tokens/s against the engine's own
offline throughput on the same prompts (goal: >= 0.98; the original MMIRAGE reported 0.954-0.969
of raw SGLang).

    .venv/bin/python benchmarks/gpu_engine.py [--model M] [--engine-python PY] [--out FILE]

Unattended, in under 8 minutes with a small model (engine start-ups included):
1. offline: the engine's own batch API (vLLM ``LLM.chat``, SGLang ``Engine.generate`` on the
   chat-templated prompts) generates every prompt at once, in a child process that frees the GPU
   when it ends;
2. mmirage: the launcher mmirage uses starts the engine's server, a few warm-up requests go
   through it, then ``mmirage run --stats`` sends every prompt (``worker_concurrency`` large
   enough to keep the server full) and reports its output tokens and run time.
Both ignore EOS at ``--max-tokens``, so both produce the same tokens. The figures go to ``--out``
(JSON). Without a visible GPU, or without an engine, it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from mmirage.config.errors import ConfigError
from mmirage.config.processors import LLMProcessorConfig
from mmirage.config.validation import build
from mmirage.core.process.engine_location import PYTHON_ENV, find_engine, gpu_visible
from mmirage.core.process.server_launcher import TIMEOUT_ENV, launch_server

HERE = Path(__file__).resolve().parent
GOAL = 0.98
# Each step's limit, so that the whole stays under 8 minutes even when every step is slow.
OFFLINE_TIMEOUT_S = 200.0  # the offline engine: load, warm-up, generation
START_TIMEOUT_S = 150.0  # the launched server, until GET /v1/models answers
RUN_TIMEOUT_S = 110.0  # mmirage run
WARM_UP = 8  # requests each side gets before it is timed (first-batch compilation, caches)

# Runs under the engine's interpreter (argv[1]: a JSON file); prints seconds and output_tokens.
_OFFLINE = {
    "vllm": """\
import json, sys, time
from vllm import LLM, SamplingParams
a = json.load(open(sys.argv[1]))
llm = LLM(model=a["model"], max_model_len=a["max_model_len"], seed=0)
params = SamplingParams(temperature=0, max_tokens=a["max_tokens"], ignore_eos=True)
chats = [[{"role": "user", "content": p}] for p in a["prompts"]]
llm.chat(chats[: a["warm_up"]], params, use_tqdm=False)
started = time.perf_counter()
outs = llm.chat(chats, params, use_tqdm=False)
seconds = time.perf_counter() - started
tokens = sum(len(o.outputs[0].token_ids) for o in outs)
print(json.dumps({"seconds": seconds, "output_tokens": tokens}))
""",
    "sglang": """\
import json, sys, time
import sglang as sgl
from transformers import AutoTokenizer
a = json.load(open(sys.argv[1]))
tok = AutoTokenizer.from_pretrained(a["model"])
texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
         add_generation_prompt=True) for p in a["prompts"]]
engine = sgl.Engine(model_path=a["model"], context_length=a["max_model_len"], random_seed=0)
params = {"temperature": 0, "max_new_tokens": a["max_tokens"], "ignore_eos": True}
engine.generate(texts[: a["warm_up"]], params)
started = time.perf_counter()
outs = engine.generate(texts, params)
seconds = time.perf_counter() - started
tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
engine.shutdown()
print(json.dumps({"seconds": seconds, "output_tokens": tokens}))
""",
}

_TOPICS = ("a lighthouse", "a glacier", "a market", "a violin", "a comet", "a harbour", "a forest")
_ASKS = ("Write a short story about", "Describe in detail", "Explain the history of", "Argue for")


def prompts(count: int) -> list[str]:
    """``count`` different prompts, the same on every run."""
    return [
        f"{_ASKS[i % len(_ASKS)]} {_TOPICS[(i // len(_ASKS)) % len(_TOPICS)]} (number {i})."
        for i in range(count)
    ]


def main() -> int:
    args = _parse()
    if not gpu_visible():
        print("skipped: no GPU visible here (no /dev/nvidia*, or CUDA_VISIBLE_DEVICES hides it)")
        return 0
    try:
        config = _processor_config(args)
        location = find_engine("gpu_engine", config.server_args)
    except ConfigError as exc:
        print(f"skipped: no vLLM or SGLang to measure ({exc})")
        return 0
    os.environ.setdefault(TIMEOUT_ENV, str(START_TIMEOUT_S))
    started = time.monotonic()
    texts = prompts(args.prompts)
    figures: dict[str, Any] = {
        "engine": location.engine,
        "model": args.model,
        "gpu": _gpu_name(),
        "prompts": len(texts),
        "max_tokens": args.max_tokens,
        "goal": GOAL,
    }
    try:
        figures["offline"] = _offline(location.engine, location.python, args, texts)
        figures["mmirage"] = _through_mmirage(config, args, texts)
    except (RuntimeError, OSError, subprocess.SubprocessError, ConfigError) as exc:
        figures["error"] = str(exc)
    figures["total_seconds"] = round(time.monotonic() - started, 1)
    if "error" not in figures:
        ratio = figures["mmirage"]["tokens_per_s"] / figures["offline"]["tokens_per_s"]
        figures["ratio"] = round(ratio, 4)
        figures["goal_met"] = ratio >= GOAL
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))
    print(f"figures written to {args.out}")
    return 1 if "error" in figures else 0


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=os.environ.get("MMIRAGE_GPU_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
    )
    parser.add_argument(
        "--engine-python",
        default=os.environ.get(PYTHON_ENV, ""),
        help="the python that has vLLM or SGLang (default: $MMIRAGE_ENGINE_PYTHON, else this one)",
    )
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument(
        "--concurrency", type=int, default=1024, help="mmirage's worker_concurrency"
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "gpu_engine.json")
    return parser.parse_args()


def _processor_config(args: argparse.Namespace) -> LLMProcessorConfig:
    raw = {
        "type": "llm",
        "model": "bench",
        "worker_concurrency": args.concurrency,
        "server_args": {
            "model_path": args.model,
            "engine_python": args.engine_python,
            "extra_engine_args": {"context_length": args.max_model_len, "random_seed": 0},
        },
    }
    return build(LLMProcessorConfig, raw, ("processors", 0), "gpu_engine")


def _offline(
    engine: str, python: str, args: argparse.Namespace, texts: list[str]
) -> dict[str, Any]:
    payload = {
        "model": args.model,
        "prompts": texts,
        "max_tokens": args.max_tokens,
        "max_model_len": args.max_model_len,
        "warm_up": WARM_UP,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as spec:
        json.dump(payload, spec)
        spec.flush()
        done = subprocess.run(
            [python, "-c", _OFFLINE[engine], spec.name],
            capture_output=True,
            text=True,
            timeout=OFFLINE_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"the offline {engine} run exited with {done.returncode}: {tail}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["tokens_per_s"] = round(result["output_tokens"] / result["seconds"], 1)
    return result


def _through_mmirage(
    config: LLMProcessorConfig, args: argparse.Namespace, texts: list[str]
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        server = launch_server(config, root / "logs")  # mmirage's own launcher
        try:
            _warm_up(server.base_url, server.api_key, server.served_name, texts[:WARM_UP], args)
            _write_pipeline(root, server.base_url, args, texts)
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "mmirage", "run", "--stats", "pipeline.yaml"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT_S,
                env={**os.environ, "OPENAI_API_KEY": server.api_key},
                check=False,
            )
            wall = time.monotonic() - started
        finally:
            server.stop()
    if done.returncode != 0:
        raise RuntimeError(f"mmirage run exited with {done.returncode}: {done.stderr.strip()}")
    stats = json.loads(done.stdout)["aggregate"]
    seconds = float(stats["sum_runtime_seconds"])
    tokens = int(stats["total_output_tokens"])
    return {
        "rows_done": stats["total_rows_done"],
        "rows_failed": stats["total_rows_failed"],
        "output_tokens": tokens,
        "seconds": seconds,
        "wall_seconds": round(wall, 2),  # with the CLI's start-up and the output's publication
        "tokens_per_s": round(tokens / seconds, 1),
    }


def _warm_up(
    base_url: str, key: str, model: str, texts: list[str], args: argparse.Namespace
) -> None:
    for text in texts:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
        request = urllib.request.Request(
            base_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            reply.read()


def _write_pipeline(root: Path, base_url: str, args: argparse.Namespace, texts: list[str]) -> None:
    (root / "prompts.jsonl").write_text("".join(json.dumps({"p": t}) + "\n" for t in texts))
    config = {
        "processors": [
            {
                "type": "llm",
                "base_url": base_url,
                "model": "bench",
                "worker_concurrency": args.concurrency,
                "input_buffer_size": args.concurrency,
                "default_sampling_params": {
                    "temperature": 0,
                    "max_new_tokens": args.max_tokens,
                    "ignore_eos": True,
                },
            }
        ],
        "loading_params": {
            "state_dir": "state",
            "datasets": [{"path": "prompts.jsonl", "type": "JSONL", "output_dir": "out"}],
            "output_format": "jsonl",
            "batch_size": len(texts),
        },
        "processing_params": {
            "inputs": [{"name": "p", "key": "p"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "{{ p }}"}],
            "output_schema": {"answer": "{{ answer }}"},
        },
    }
    (root / "pipeline.yaml").write_text(json.dumps(config))  # JSON is YAML


def _gpu_name() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "unknown"


if __name__ == "__main__":
    sys.exit(main())
