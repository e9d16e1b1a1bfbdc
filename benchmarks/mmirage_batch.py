"""mmirage batch_api: export, submission and merge throughput, side by side in one run.

The shape of the issue's comparison with the original MMIRAGE: short rows, one text input, a
two-line prompt, provider openai, ``max_requests_per_chunk: 50000``, ``batch_size: 512``.

For each of ``--small`` and ``--rows`` rows (once when they are equal), on the same data file:

1. ``mmirage run --export-prompts``: rows/s, peak RSS (targets: ≥ 17,000 rows/s, ≤ 500 MB;
   the large size within 10 % of the small one);
2. ``mmirage run`` submitting the rows to the emulator (in its own process, batches finishing
   at once): rows/s and its ratio to the export (target ≥ 0.80);
3. ``mmirage merge --output-path`` of the results: rows/s and peak RSS, and its ratio to the
   export of the same rows (targets: ≥ 0.65, ≤ 300 MB at 1M; the large size within 10 % of the
   small one). This first merge counts everything a user waits for: reading the receipts,
   downloading the results from the emulator into the results store, and writing the merged
   file; a second merge (results already in the store: nothing downloaded) is shown apart.

Every command runs as its own process; its peak RSS comes from ``wait4``.
Usage: python benchmarks/mmirage_batch.py [--rows 1000000] [--small 200000] [--export-only]
(``--rows 200000 --small 200000``: the comparison on 200k rows alone.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from _common import report  # noqa: E402
from provider_emulator import EmulatorConfig, running_emulator  # noqa: E402

MMIRAGE = [str(Path(sys.executable).with_name("mmirage"))]  # the installed console script
ORIGINAL_EXPORT = 1700  # rows/s of the original's export (424 MB at 200k)


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
    workdir.mkdir(parents=True, exist_ok=True)
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


@dataclass
class Rate:
    rows_per_s: float
    rss_mb: float

    def __str__(self) -> str:
        return f"{self.rows_per_s:,.0f} rows/s, peak RSS {self.rss_mb:.0f} MB"


@dataclass
class Figures:
    rows: int
    export: Rate
    submit: Rate | None = None
    merge: Rate | None = None
    merge_again: Rate | None = None  # the results already in the store


def measure(rows: int, root: Path, env: dict[str, str], base_url: str | None) -> Figures:
    """Export, then (with an emulator at ``base_url``) submit and merge, ``rows`` rows."""
    workdir = root / str(rows)
    workdir.mkdir()
    data = workdir / "data.jsonl"
    write_rows(data, rows)

    def rate(argv: list[str], run_env: dict[str, str]) -> Rate:
        seconds, rss = timed(argv, run_env)
        return Rate(rows / seconds, rss)

    config = write_config(workdir / "export", data, "http://127.0.0.1:9/v1")
    figures = Figures(
        rows, rate([*MMIRAGE, "run", str(config), "--export-prompts", str(workdir / "export")], env)
    )
    if base_url is None:
        return figures
    config = write_config(workdir / "submit", data, base_url)
    submit_env = {**env, "OPENAI_API_KEY": "sk-bench"}
    figures.submit = rate([*MMIRAGE, "run", str(config)], submit_env)
    merged = workdir / "merged.jsonl"
    merge_argv = [*MMIRAGE, "merge", str(config), "--output-path", str(merged)]
    figures.merge = rate(merge_argv, submit_env)
    with open(merged, "rb") as f:
        lines = sum(1 for _ in f)
    if lines != rows:
        raise SystemExit(f"merge wrote {lines:,} rows of {rows:,}")
    figures.merge_again = rate(merge_argv, submit_env)
    return figures


@contextlib.contextmanager
def emulator(wanted: bool) -> Iterator[str | None]:
    if not wanted:
        yield None
        return
    with running_emulator(EmulatorConfig(), subprocess=True) as emu:
        yield emu.openai_base_url


def show(fig: Figures) -> None:
    lines = [
        ("export", str(fig.export)),
        (
            "export vs the original",
            f"{fig.export.rows_per_s / ORIGINAL_EXPORT:.1f}× (target ≥ 10×)",
        ),
    ]
    if fig.submit and fig.merge and fig.merge_again:
        submit_ratio = fig.submit.rows_per_s / fig.export.rows_per_s
        merge_ratio = fig.merge.rows_per_s / fig.export.rows_per_s
        lines += [
            ("submit", str(fig.submit)),
            ("submit / export", f"{submit_ratio:.2f} (target ≥ 0.80)"),
            ("merge (download included)", f"{fig.merge} (target ≤ 300 MB at 1M)"),
            ("merge / export", f"{merge_ratio:.2f} (target ≥ 0.65)"),
            ("merge again (no download)", str(fig.merge_again)),
        ]
    report(f"{fig.rows:,} rows (original export: ~1,700 rows/s, 424 MB at 200k)", lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--small", type=int, default=200_000)
    parser.add_argument("--export-only", action="store_true", help="skip submission and merge")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    results: list[Figures] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-mmirage-batch-") as tmp,
        emulator(not args.export_only) as base_url,
    ):
        for rows in sorted({args.small, args.rows}):
            results.append(measure(rows, Path(tmp), env, base_url))
            show(results[-1])
    if len(results) == 2:
        small, big = results
        rate = big.export.rows_per_s / small.export.rows_per_s
        lines = [("export", f"{rate:.2f} (target ≥ 0.90)")]
        if small.merge and big.merge:
            rate = big.merge.rows_per_s / small.merge.rows_per_s
            lines.append(("merge", f"{rate:.2f} (target ≥ 0.90)"))
        report(f"{big.rows:,} rows / {small.rows:,} rows, rate", lines)


if __name__ == "__main__":
    main()
