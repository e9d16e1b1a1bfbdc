"""Pay once: requests paid against distinct requests over the ordinary moments of a pipeline's
life, counted at the emulator (its ``requests`` counter counts a request when it arrives, as a
provider bills it).

The real CLI in local mode against the emulator in its own process (``--latency`` seconds per
answer), ``--rows`` rows × 2 outputs (a plain answer, then a JSON label that reads it):

1. run it to its end;
2. run it again from nothing, Ctrl-C (SIGINT) mid-run, rerun it;
3. edit ``output_schema`` (the published shape only), rerun;
4. edit the second output's prompt, rerun;
5. a row whose JSON answer never validates (``invalid_json: always``), then ``retry`` twice;
6. the same life as ``batch_api`` outputs: submit, edit ``output_schema``, edit one prompt,
   ``--recompute`` (requests counted in the receipts: what was put in provider batches).

A step's distinct requests are the requests nobody had asked before (an edited prompt: one
per row; a validation re-ask quotes the bad answer, so it is a request of its own). Goal: paid
equals distinct at every step. Also prints the answer store's bytes per answer, as logged and
once folded into its index, for 20,000 answers like the run's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

from _common import report
from mmirage.core.process.base import OutputResult
from mmirage.core.shard.answers import AnswerStore
from mmirage.core.shard.request_keys import request_digest, request_identity
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle

ENV = {**os.environ, "OPENAI_API_KEY": "sk-bench"}


def pipeline(tmp: Path, name: str, base_url: str, rows: int, **edits: Any) -> Path:
    data = tmp / "data.jsonl"
    if not data.exists():
        data.write_text("".join(json.dumps({"text": f"review {i}"}) + "\n" for i in range(rows)))
    label_prompt = edits.get("label_prompt", "Label this summary: {{ summary }}")
    body = {
        "processors": [
            {
                "type": "llm",
                "base_url": base_url,
                "model": "m",
                "worker_concurrency": 8,
                "validation_retries": 2,
            }
        ],
        "loading_params": {
            "state_dir": str(tmp / name / "state"),
            "datasets": [
                {"path": str(data), "type": "JSONL", "output_dir": str(tmp / name / "out")}
            ],
            "output_format": "jsonl",
            "batch_size": 8,
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text"}],
            "outputs": [
                {"name": "summary", "type": "llm", "prompt": "Summarise: {{ text }}"},
                {
                    "name": "label",
                    "type": "llm",
                    "prompt": label_prompt,
                    "output_type": "JSON",
                    "output_schema": {"sentiment": "str"},
                },
            ],
            "output_schema": edits.get(
                "output_schema", {"summary": "{{ summary }}", "sentiment": "{{ label.sentiment }}"}
            ),
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def batch_pipeline(tmp: Path, base_url: str, rows: int, **edits: Any) -> Path:
    """``rows`` rows × 2 ``batch_api`` outputs (a prompt may not read a batch_api output: both
    read the row)."""
    path = pipeline(tmp, "batch", base_url, rows)
    body = yaml.safe_load(path.read_text())
    body["processors"] = [
        {"type": "batch_api", "provider": "openai", "model": "gpt-4o-mini", "base_url": base_url}
    ]
    summary, label = body["processing_params"]["outputs"]
    summary["type"], label["type"] = "batch_api", "batch_api"
    label["prompt"] = edits.get("label_prompt", "Label this review: {{ text }}")
    schema = edits.get("output_schema")
    if schema is not None:
        body["processing_params"]["output_schema"] = schema
    path.write_text(yaml.safe_dump(body))
    return path


def submitted(state: Path) -> int:
    """Requests the receipts under ``state`` say were put in provider batches."""
    return sum(
        orjson.loads(line)["submitted_request_count"]
        for receipt in state.rglob("batch_metadata.*.jsonl")
        for line in receipt.read_bytes().splitlines()
        if line.strip()
    )


def mmirage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args], env=ENV, capture_output=True, text=True
    )


def paid(emu: EmulatorHandle, step: Any) -> int:
    emu.reset_stats()
    step()
    return int(emu.stats()["requests"])


def interrupted_run(config: Path, out: Path) -> None:
    """``mmirage run`` stopped by SIGINT once its first rows are checkpointed."""
    run = subprocess.Popen(
        [sys.executable, "-m", "mmirage", "run", str(config)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    checkpoint = out / ".parts" / "shard-0-of-1.ckpt.json"
    while not checkpoint.exists():
        if run.poll() is not None:
            raise SystemExit(f"the run ended before its first checkpoint: {run.stderr}")
        time.sleep(0.02)
    run.send_signal(signal.SIGINT)
    run.communicate(timeout=120)
    if run.returncode == 0:
        raise SystemExit("the interrupted run exited 0")


def store_bytes_per_answer(state: Path, tmp: Path, answers: int) -> tuple[float, float]:
    """(log, index) bytes per answer for ``answers`` answers like the run's own (its stored
    entries cycled under new digests): at the run's few dozen answers the index's pages would
    be mostly empty."""
    entries: list[bytes] = []
    for log in state.rglob("answers/*.log"):
        with AnswerStore(log.parent, log.name.removesuffix(".log")) as store:
            store.open()  # folds the last run's answers into the index
        with sqlite3.connect(store.index_path) as db:
            entries += [row[0] for row in db.execute("SELECT entry FROM answers")]
    folder = tmp / "sized"
    with AnswerStore(folder, "shard-0-of-1") as store:
        store.open()
        for n in range(answers):
            key = f"0::{n}"
            entry = orjson.loads(entries[n % len(entries)])
            digest = request_digest(request_identity("sized"), key, str(n))
            store.add(
                digest, key, entry[1], OutputResult(entry[2], None, False, False, *entry[3:5])
            )
    log_bytes = store.log_path.stat().st_size
    with AnswerStore(folder, "shard-0-of-1") as store:
        store.open()
    index_bytes = sum(p.stat().st_size for p in folder.glob("shard-0-of-1.sqlite*"))
    return log_bytes / answers, index_bytes / answers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--latency", type=float, default=0.3)
    args = parser.parse_args()
    rows: list[tuple[str, str]] = []

    def step(name: str, spent: int, distinct: int) -> None:
        verdict = "ok" if spent == distinct else f"{spent - distinct:+d} paid twice"
        rows.append((name, f"{spent:4d} paid / {distinct:4d} distinct  {verdict}"))

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        with running_emulator(EmulatorConfig(latency_s=args.latency), subprocess=True) as emu:
            base = emu.openai_base_url
            n = args.rows
            first = pipeline(tmp, "life", base, n)
            step("1. run", paid(emu, lambda: mmirage("run", str(first))), 2 * n)
            again = pipeline(tmp, "stopped", base, n)
            spent = paid(emu, lambda: interrupted_run(again, tmp / "stopped" / "out"))
            spent += paid(emu, lambda: mmirage("run", str(again)))
            step("2. Ctrl-C mid-run, rerun", spent, 2 * n)
            schema = {"summary": "{{ summary }}", "mood": "{{ label.sentiment }}"}
            edited = pipeline(tmp, "life", base, n, output_schema=schema)
            step(
                "3. output_schema edited, rerun", paid(emu, lambda: mmirage("run", str(edited))), 0
            )
            prompt = "Label the sentiment of: {{ summary }}"
            reworded = pipeline(tmp, "life", base, n, output_schema=schema, label_prompt=prompt)
            step("4. one prompt edited, rerun", paid(emu, lambda: mmirage("run", str(reworded))), n)
            log_bytes, index_bytes = store_bytes_per_answer(tmp / "life" / "state", tmp, 20_000)
        invalid = EmulatorConfig(latency_s=args.latency, invalid_json="always")
        with running_emulator(invalid, subprocess=True) as emu:
            broken = pipeline(tmp, "invalid", emu.openai_base_url, n)
            # Each row: its summary, then its label asked once and re-asked twice (each re-ask
            # quotes the bad answer: a new request); 'retry' then buys nothing.
            spent = paid(emu, lambda: mmirage("run", str(broken)))
            spent += paid(emu, lambda: mmirage("retry", str(broken)))
            spent += paid(emu, lambda: mmirage("retry", str(broken)))
            step("5. answers that never validate, retry x2", spent, n * (1 + 3))
        with running_emulator(EmulatorConfig(), subprocess=True) as emu:
            state = tmp / "batch" / "state"
            reworded = {"label_prompt": "Mood: {{ text }}"}
            for name, distinct, edits, flags in (
                ("6a. batch_api: submit", 2 * n, {}, ()),
                (
                    "6b. batch_api: output_schema edited",
                    0,
                    {"output_schema": {"s": "{{ text }}"}},
                    (),
                ),
                ("6c. batch_api: one prompt edited", n, reworded, ()),
                ("6d. batch_api: --recompute", 0, reworded, ("--recompute",)),
            ):
                config = batch_pipeline(tmp, emu.openai_base_url, n, **edits)
                before = submitted(state)
                done = mmirage("run", str(config), *flags)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed:\n{done.stderr}")
                step(name, submitted(state) - before, distinct)
    report(
        f"pay once: {args.rows} rows x 2 outputs, emulator latency {args.latency:g} s",
        [
            *rows,
            (
                "answer store, 20,000 such answers",
                f"{log_bytes:.0f} bytes an answer as logged, {index_bytes:.0f} once indexed",
            ),
        ],
    )


if __name__ == "__main__":
    main()
