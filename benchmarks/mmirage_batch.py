"""mmirage batch_api: export, submission and merge throughput, side by side in one run.

The shape of the issue's comparison with the original MMIRAGE: short rows, one text input, a
two-line prompt, provider openai, ``max_requests_per_chunk: 50000``, ``batch_size: 512``.

1. ``mmirage run --export-prompts`` on 100k and 1M rows: rows/s, peak RSS, linearity
   (targets: ≥ 17,000 rows/s, ≤ 500 MB, 1M within 10 % of 100k);
2. ``mmirage run`` submitting the same 1M rows to the emulator (in its own process, batches
   finishing at once): rows/s and its ratio to the export (target ≥ 0.80);
3. ``mmirage merge --output-path`` of the 1M results: rows/s and peak RSS (≥ 20,000, ≤ 500 MB).

Every command runs as its own process; its peak RSS comes from ``wait4``.
Usage: python benchmarks/mmirage_batch.py [--rows 1000000] [--small 100000] [--export-only]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from _common import report  # noqa: E402
from provider_emulator import EmulatorConfig, running_emulator  # noqa: E402

MMIRAGE = [str(Path(sys.executable).with_name("mmirage"))]  # the installed console script


def write_rows(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": i, "question": f"What is {i} plus {i + 7}?"}) + "\n")


def write_config(workdir: Path, data: Path, base_url: str) -> Path:
    text = f"""
processors:
  - type: batch_api
    provider: openai
    model: gpt-4o-mini
    max_requests_per_chunk: 50000
    metadata_output_path: {workdir}/meta/batch_meta.jsonl
    base_url: {base_url}
loading_params:
  state_dir: {workdir}/state
  datasets:
    - path: {data}
      type: JSONL
      output_dir: {workdir}/shards
  num_shards: 1
  batch_size: 512
  output_format: jsonl  # what the dry run publishes too; merge writes the final JSONL anyway
processing_params:
  inputs:
    - name: question
      key: question
  outputs:
    - name: answer
      type: batch_api
      output_type: plain
      prompt: |
        Answer the following question concisely:
        {{{{ question }}}}
  output_schema:
    question: "{{{{ question }}}}"
    answer: "{{{{ answer }}}}"
"""
    path = workdir / "config.yaml"
    path.write_text(text)
    return path


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one command."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        assert proc.stderr is not None
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr.read().decode()}")
    return elapsed, usage.ru_maxrss / 1024


def export(rows: int, root: Path, env: dict[str, str]) -> tuple[float, float]:
    workdir = root / f"export-{rows}"
    workdir.mkdir()
    write_rows(workdir / "data.jsonl", rows)
    config = write_config(workdir, workdir / "data.jsonl", "http://127.0.0.1:9/v1")
    seconds, rss = timed([*MMIRAGE, "run", str(config), "--export-prompts", str(workdir)], env)
    return rows / seconds, rss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--export-only", action="store_true", help="skip submission and merge")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    with tempfile.TemporaryDirectory(prefix="bench-mmirage-batch-") as tmp:
        root = Path(tmp)
        small_rate, small_rss = export(args.small, root, env)
        big_rate, big_rss = export(args.rows, root, env)
        report(
            "mmirage run --export-prompts (original: ~1,700 rows/s, 424 MB at 200k)",
            [
                (f"{args.small:,} rows", f"{small_rate:,.0f} rows/s, peak RSS {small_rss:.0f} MB"),
                (f"{args.rows:,} rows", f"{big_rate:,.0f} rows/s, peak RSS {big_rss:.0f} MB"),
                ("large / small rate", f"{big_rate / small_rate:.2f} (target ≥ 0.90)"),
                ("vs the original", f"{big_rate / 1700:.1f}× (target ≥ 10×)"),
            ],
        )

        if args.export_only:
            return
        workdir = root / "submit"
        workdir.mkdir()
        write_rows(workdir / "data.jsonl", args.rows)
        with running_emulator(EmulatorConfig(), subprocess=True) as emu:
            config = write_config(workdir, workdir / "data.jsonl", emu.openai_base_url)
            submit_env = {**env, "OPENAI_API_KEY": "sk-bench"}
            seconds, submit_rss = timed([*MMIRAGE, "run", str(config)], submit_env)
            submit_rate = args.rows / seconds
            merged = workdir / "merged.jsonl"
            merge_argv = [*MMIRAGE, "merge", str(config), "--output-path", str(merged)]
            seconds, merge_rss = timed(merge_argv, submit_env)
            merge_rate = args.rows / seconds
        with open(merged, "rb") as f:
            lines = sum(1 for _ in f)
        report(
            f"mmirage run (submit to the emulator) and merge, {args.rows:,} rows",
            [
                ("submit", f"{submit_rate:,.0f} rows/s, peak RSS {submit_rss:.0f} MB"),
                ("submit / export", f"{submit_rate / big_rate:.2f} (target ≥ 0.80)"),
                ("merge", f"{merge_rate:,.0f} rows/s, peak RSS {merge_rss:.0f} MB (≥ 20,000)"),
                ("merged rows", f"{lines:,}"),
            ],
        )


if __name__ == "__main__":
    main()
