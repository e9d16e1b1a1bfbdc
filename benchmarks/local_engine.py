"""The embedded llama.cpp engine (SmolLM2-135M-Instruct on the CPU), measured.

Run: ``python benchmarks/local_engine.py [--rows 64] [--max-tokens 64] [--skip-server]
[--threads-matrix] [--demo-before REV]``. Prints, on the benchmark's prompts ("Write two
sentences about ...", temperature 0):

- answers: how many batched answers equal the one-at-a-time answers, and JSON validity;
- side by side, quiet, while another process keeps one core busy, and quiet with JSON answers
  (held by a grammar on both sides): ``mmirage run`` on the embedded default against the same
  pipeline sent to llama.cpp's ``llama-server`` with 8 slots on the same GGUF (found or built,
  see ``_llama_server.py``; skipped with the reason where it cannot be): output tokens/s,
  their ratio, and each side's peak RSS;
- ``--threads-matrix``: engine tokens/s for 1 and 2 threads x OpenMP wait policies, quiet
  and loaded (what ``llm_kit/local/threads.py`` chose from);
- ``--demo-before REV``: ``make demo``'s ``mmirage run`` with this tree and with git REV's.
Not a test: figures on a shared machine are noisy, so compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from _common import report, run_child

ROOT = Path(__file__).resolve().parents[1]
TOPICS = [  # 64 different topics: the default rows repeat no prompt
    "the sea",
    "cats",
    "Paris",
    "bread",
    "winter",
    "trains",
    "music",
    "rain",
    "coffee",
    "mountains",
    "books",
    "the moon",
    "gardens",
    "bicycles",
    "chess",
    "volcanoes",
    "owls",
    "tea",
    "deserts",
    "bridges",
    "snow",
    "apples",
    "clocks",
    "rivers",
    "bees",
    "lighthouses",
    "autumn",
    "pianos",
    "maps",
    "tigers",
    "candles",
    "forests",
    "harbours",
    "glaciers",
    "kites",
    "lanterns",
    "meadows",
    "pottery",
    "sailboats",
    "comets",
    "orchards",
    "foxes",
    "canyons",
    "violins",
    "markets",
    "whales",
    "castles",
    "fireflies",
    "islands",
    "telescopes",
    "gardeners",
    "storms",
    "puzzles",
    "waterfalls",
    "pumpkins",
    "robots",
    "libraries",
    "penguins",
    "bakeries",
    "dragons",
    "caves",
    "festivals",
    "windmills",
    "sunflowers",
]


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]
    score: float


def prompts(rows: int) -> list[str]:
    return [f"Write two sentences about {TOPICS[i % len(TOPICS)]}." for i in range(rows)]


@contextlib.contextmanager
def one_core_busy(busy: bool) -> Iterator[None]:
    """Another process spinning on one core while the block runs (both sides of a pair)."""
    if not busy:
        yield
        return
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


# -- answers ------------------------------------------------------------------------------


def answers(rows: int, max_tokens: int) -> list[tuple[str, str]]:
    from llm_kit.local import LocalEngine

    texts = prompts(rows)

    async def batch(engine: LocalEngine, schema: dict[str, Any] | None = None) -> list[Any]:
        return await asyncio.gather(
            *(
                engine.complete(
                    [{"role": "user", "content": t}], max_tokens=max_tokens, json_schema=schema
                )
                for t in texts
            )
        )

    alone_engine = LocalEngine(slots=1)
    alone = asyncio.run(batch(alone_engine))
    alone_engine.close()
    engine = LocalEngine()
    batched = asyncio.run(batch(engine))
    stats = dataclasses.replace(engine.stats)  # before the JSON requests add to it
    json_answers = asyncio.run(batch(engine, Sentiment.model_json_schema()))
    engine.close()
    equal = sum(a.text == b.text for a, b in zip(alone, batched, strict=True))
    ended = [r for r in json_answers if r.finish_reason == "stop"]
    valid = 0
    for result in ended:
        with contextlib.suppress(ValueError, ValidationError):
            Sentiment.model_validate(json.loads(result.text or ""))
            valid += 1
    return [
        ("batched == one at a time (temperature 0)", f"{equal} of {rows}"),
        (
            "JSON answers that validate (batched)",
            f"{valid} of the {len(ended)} that ended ({rows - len(ended)} cut at max_tokens)",
        ),
        ("widest batch / decode calls", f"{stats.widest_batch} / {stats.decode_calls}"),
        ("llama.cpp graphs reused (of one or more per decode call)", f"{stats.graphs_reused}"),
        (
            "prompt tokens kept in a slot from the request before",
            f"{stats.prompt_tokens_reused} of {sum(r.usage.input_tokens for r in batched)}",
        ),
    ]


# -- mmirage run, embedded and against llama-server ---------------------------------------

# The answer column: plain text, or JSON held by a grammar on both sides.
OUTPUTS = {
    False: ("      output_type: plain", "answer"),
    True: (
        "      output_type: JSON\n      output_schema: {sentence: {type: str}}",
        "answer.sentence",
    ),
}

CONFIG = """\
processors:
  - type: llm
{processor}
    default_sampling_params: {{temperature: 0, max_new_tokens: {max_tokens}{extra}}}
loading_params:
  state_dir: {dir}/state
  datasets: [{{path: {dir}/rows.jsonl, type: JSONL, output_dir: {dir}/data}}]
  output_format: jsonl
  batch_size: {rows}
processing_params:
  inputs: [{{name: topic, key: topic}}]
  outputs:
    - name: answer
      type: llm
{output}
      prompt: "Write two sentences about {{{{ topic }}}}."
  remove_columns: true
  output_schema: {{topic: "{{{{ topic }}}}", answer: "{{{{ {answer} }}}}"}}
execution_params: {{mode: local, merge: false}}
"""


def mmirage_run(
    workdir: Path,
    processor: str,
    rows: int,
    max_tokens: int,
    extra: str = "",
    as_json: bool = False,
) -> tuple[float, int, float]:
    """(seconds, output tokens, peak RSS MB) of one ``mmirage run`` in a fresh folder: plain
    answers counted with the model's tokenizer (the same count for both sides), JSON answers
    as the run reports them."""
    workdir.mkdir(parents=True)
    with (workdir / "rows.jsonl").open("w") as out:
        for i in range(rows):
            out.write(json.dumps({"topic": TOPICS[i % len(TOPICS)]}) + "\n")
    config = workdir / "config.yaml"
    config.write_text(
        CONFIG.format(
            processor=processor,
            max_tokens=max_tokens,
            extra=extra,
            dir=workdir,
            rows=rows,
            output=OUTPUTS[as_json][0],
            answer=OUTPUTS[as_json][1],
        )
    )
    mmirage = Path(sys.executable).with_name("mmirage")
    start = time.perf_counter()
    # A JSON answer cut at max_tokens fails its row (exit 1): its tokens still count.
    _, rss = run_child([str(mmirage), "run", str(config)], ok_codes=(0, 1) if as_json else (0,))
    seconds = time.perf_counter() - start
    if as_json:
        return seconds, _reported_output_tokens(workdir), rss
    texts = []
    for shard in sorted((workdir / "data").rglob("*.jsonl")):
        texts += [json.loads(line)["answer"] or "" for line in shard.read_text().splitlines()]
    return seconds, count_tokens(texts), rss


def _reported_output_tokens(workdir: Path) -> int:
    """The output tokens the run recorded (usage of every answer, failed rows too; the
    server's count includes each answer's end token, the engine's does not: about one token
    per row in the server's favour)."""
    statuses = [json.loads(f.read_text()) for f in (workdir / "state").rglob("status.json")]
    done = sum(s["rows_done"] for s in statuses)
    failed = sum(s["rows_failed"] for s in statuses)
    if not done or failed > done // 4:  # a run that mostly failed measures nothing
        raise RuntimeError(f"{failed} of {done} rows failed in {workdir}: not a measurement")
    return sum(s["output_tokens"] for s in statuses)


def count_tokens(texts: list[str]) -> int:
    """Output tokens, counted with the model's own tokenizer (the same count for both sides)."""
    import llama_cpp

    from llm_kit.local import default_model_path

    vocab = llama_cpp.Llama(str(default_model_path()), vocab_only=True, verbose=False)
    return sum(len(vocab.tokenize(t.encode(), add_bos=False)) for t in texts)


# (label, another process keeps one core busy, JSON answers held by a grammar)
CONDITIONS = [
    ("quiet", False, False),
    ("one core busy", True, False),
    ("quiet, JSON answers", False, True),
]


def side_by_side(
    rows: int, max_tokens: int, skip_server: bool, repeat: int, tmp: Path
) -> list[tuple[str, str]]:
    import _llama_server
    from llm_kit.local import default_model_path

    out: list[tuple[str, str]] = []
    if skip_server:
        server, why = None, "skipped (--skip-server)"
    else:
        server, why = _llama_server.find_or_build(tmp / "build.log")
    out.append(("llama-server", f"{server or 'not available'}: {why}"))
    proc = url = None
    if server is not None:
        try:
            proc, url = _llama_server.start(
                server, default_model_path(), 8, 2048, tmp / "server.log"
            )
            # Not timed: the server's first requests page its model in and start its threads
            # (measured up to 2.5x slower), which the embedded side pays in each fresh process.
            mmirage_run(tmp / "server-warm-up", f"    base_url: {url}\n    model: smollm2", 16, 16)
        except RuntimeError as exc:
            out.append(("llama-server start", f"failed, comparison skipped: {exc}"))
    try:
        for load, busy, as_json in CONDITIONS:
            slug = load.replace(",", "").replace(" ", "-")  # a folder name YAML reads as is
            local: list[float] = []
            remote: list[float] = []
            rss = 0.0
            with one_core_busy(busy):
                for attempt in range(repeat):  # alternated: both sides see the same load
                    seconds, tokens, peak = mmirage_run(
                        tmp / f"local-{slug}-{attempt}", "    message_format: local", rows,
                        max_tokens, as_json=as_json,
                    )  # fmt: skip
                    local.append(tokens / seconds)
                    rss = max(rss, peak)
                    if url is None:
                        continue
                    seconds, tokens, _ = mmirage_run(
                        tmp / f"server-{slug}-{attempt}",
                        f"    base_url: {url}\n    model: smollm2\n"
                        "    structured_output: json_schema",  # the form it follows, named
                        rows,
                        max_tokens,
                        extra=", extra_body: {repeat_penalty: 1.1}",  # the engine's own penalty
                        as_json=as_json,
                    )
                    remote.append(tokens / seconds)
            runs = ", ".join(f"{x:.0f}" for x in local)
            line = f"median {statistics.median(local):.0f} tok/s of {runs}; peak RSS {rss:.0f} MB"
            out.append((f"mmirage run, embedded, {load}", line))
            if remote:
                runs = ", ".join(f"{x:.0f}" for x in remote)
                out.append(
                    (
                        f"mmirage run -> llama-server -np 8, {load}",
                        f"median {statistics.median(remote):.0f} tok/s of {runs}",
                    )
                )
                ratio = statistics.median(local) / statistics.median(remote)
                out.append((f"ratio embedded / llama-server, {load}", f"{ratio:.2f}"))
        if proc is not None:
            out.append(("llama-server peak RSS", f"{_peak_rss_of(proc.pid):.0f} MB"))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
    return out


def _peak_rss_of(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# -- threads and wait policy --------------------------------------------------------------

ENGINE_RUN = """
import asyncio, sys, time
from llm_kit.local import LocalEngine
engine = LocalEngine(n_threads=int(sys.argv[1]) or None)  # 0: tuned
engine.load()
texts = [f"Write two sentences about topic number {i}." for i in range(int(sys.argv[2]))]
async def main():
    return await asyncio.gather(*(engine.complete([{"role": "user", "content": t}],
                                  max_tokens=int(sys.argv[3])) for t in texts))
start = time.perf_counter()
results = asyncio.run(main())
print(sum(r.usage.output_tokens for r in results) / (time.perf_counter() - start))
"""


def threads_matrix(rows: int, max_tokens: int) -> list[tuple[str, str]]:
    out = []
    for busy in (False, True):
        for threads in (0, 1, 2):
            for policy in ("default", "PASSIVE", "ACTIVE") if threads else ("default",):
                env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
                if policy != "default":
                    env["OMP_WAIT_POLICY"] = policy
                with one_core_busy(busy):
                    argv = [
                        sys.executable,
                        "-c",
                        ENGINE_RUN,
                        str(threads),
                        str(rows),
                        str(max_tokens),
                    ]
                    tps = float(
                        subprocess.run(
                            argv, env=env, capture_output=True, text=True, check=True
                        ).stdout
                    )
                load = "one core busy" if busy else "quiet"
                what = f"{threads} thread(s)" if threads else "tuned threads"
                out.append((f"{load}, {what}, wait {policy}", f"{tps:.0f} tok/s"))
    return out


# -- make demo ----------------------------------------------------------------------------


def demo_times(before: str | None, tmp: Path) -> list[tuple[str, str]]:
    trees = [("this tree", None)]
    if before:
        head = tmp / "head"
        head.mkdir()
        archive = subprocess.run(
            ["git", "archive", before, "src"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(head)], input=archive.stdout, check=True)
        trees.append((f"git {before}", head / "src"))
    seconds: dict[str, list[float]] = {name: [] for name, _ in trees}
    mmirage = Path(sys.executable).with_name("mmirage")
    for attempt in range(3):  # alternated, so that both trees see the same load
        for name, src in trees:
            work = tmp / f"demo-{attempt}-{name.replace(' ', '-')}"
            (work / "examples").mkdir(parents=True)
            shutil.copytree(ROOT / "examples" / "quickstart", work / "examples" / "quickstart")
            env = {**os.environ, **({"PYTHONPATH": str(src)} if src else {})}
            start = time.perf_counter()
            subprocess.run(
                [str(mmirage), "run", "examples/quickstart/config.yaml"],
                cwd=work,
                env=env,
                check=True,
                capture_output=True,
            )
            seconds[name].append(time.perf_counter() - start)
    return [
        (
            f"make demo's mmirage run, {name}",
            f"median {statistics.median(s):.1f} s of " + ", ".join(f"{x:.1f}" for x in s),
        )
        for name, s in seconds.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--skip-server", action="store_true", help="no llama-server comparison")
    parser.add_argument("--repeat", type=int, default=3, help="alternated runs of each side")
    parser.add_argument("--threads-matrix", action="store_true")
    parser.add_argument(
        "--demo-before", metavar="REV", help="also time the demo of this git revision"
    )
    parser.add_argument("--only", choices=("answers", "side", "threads", "demo"))
    args = parser.parse_args()
    print(f"usable CPUs: {len(os.sched_getaffinity(0))}, load average: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "answers"):
            report("answers", answers(args.rows, args.max_tokens))
        if args.only in (None, "side"):
            report(
                "side by side",
                side_by_side(args.rows, args.max_tokens, args.skip_server, args.repeat, Path(tmp)),
            )
        if args.threads_matrix or args.only == "threads":
            report(
                "threads x wait policy (engine alone)", threads_matrix(args.rows, args.max_tokens)
            )
        if args.only in (None, "demo"):
            report("make demo", demo_times(args.demo_before, Path(tmp)))
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
