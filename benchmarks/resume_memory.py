"""Peak RSS of batch_to_jsonl(resume=True) over an output file holding N finished items.

Targets (issue 29): peak RSS <= 64 MB at N = 10M finished items, and the resume scan reads
>= 1M lines/s. Side by side, for each N:

* ``resume``: N finished lines in the file, the generator yields those N items and NEW more;
  the N are skipped, the NEW run against the server (what a resume after a crash does).
* ``no resume``: the same NEW items into an empty file (the live pipeline's own peak).
* ``scan``: ``FinishedIds.scan`` alone (how fast the resume decides what to skip).
* ``set of ids``: ``jsonl.scan``, which holds every id in a set (what resume did before; the
  provider-batch path still uses it), for N up to ``--old-max``.

Each runs in its own process, whose peak the parent reads from wait4 (ru_maxrss), against
nginx answering a fixed completion (the emulator in its own process when nginx is missing).
The output files are written with plain writes, by a child too (a child's ru_maxrss starts
from its parent's RSS at the fork: the parent must stay small), and removed after each size.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import report, run_async, run_child
from _nginx import fixed_answer_server

TARGET_MB = 64.0
TARGET_LINES_S = 1_000_000
NEW = 2_000  # unfinished items the resumed run sends


def write_finished(path: Path, n: int) -> None:
    """``n`` result lines as batch_to_jsonl writes them (one in 50 a retryable failure)."""
    ok = (
        b'","ok":true,"retryable":false,"response":"A one-line summary of the row, about as long'
        b' as a real answer is.","usage":{"input_tokens":42,"output_tokens":17},"attempts":1,'
        b'"metadata":{"source":"bench"}}\n'
    )
    failed = (
        b'","ok":false,"retryable":true,"error":"openai answered HTTP 500: server error",'
        b'"error_kind":"server_error","attempts":4,"metadata":{"source":"bench"}}\n'
    )
    with open(path, "wb") as f:
        for start in range(0, n, 100_000):
            f.write(
                b"".join(
                    b'{"id":"item-%08d' % i + (failed if i % 50 == 0 else ok)
                    for i in range(start, min(n, start + 100_000))
                )
            )


async def run_pipeline(base_url: str, first: int, last: int, out: str, resume: bool) -> None:
    from llm_kit import LLM, BatchConfig, BatchItem, Message

    llm = LLM(
        model="m",
        base_url=base_url,
        api_key="sk-bench",
        config=BatchConfig(worker_concurrency=64, input_buffer_size=1024),
    )
    items = (
        BatchItem(f"item-{i:08d}", [Message.user(f"Summarise row {i} in one line.")])
        for i in range(first, last)
    )
    started = time.perf_counter()
    written = await llm.batch_to_jsonl(items, out, resume=resume)
    elapsed = time.perf_counter() - started
    await llm.aclose()
    assert written == NEW, written
    print(f"{elapsed:.2f}")


def child(mode: str, base_url: str, n: int, out: str) -> None:
    if mode == "write":
        started = time.perf_counter()
        write_finished(Path(out), n)
        print(f"{time.perf_counter() - started:.2f}")
    elif mode == "resume":
        run_async(run_pipeline(base_url, 0, n + NEW, out, resume=True))
    elif mode == "fresh":
        run_async(run_pipeline(base_url, n, n + NEW, out, resume=False))
    elif mode == "scan":
        from llm_kit.finished_ids import FinishedIds

        started = time.perf_counter()
        with FinishedIds.scan(Path(out)) as finished:
            elapsed = time.perf_counter() - started
            assert finished.lines == n, finished.lines
        print(f"{elapsed:.2f}")
    elif mode == "old":
        from llm_kit.jsonl import scan

        started = time.perf_counter()
        assert len(scan(Path(out)).done) == n
        print(f"{time.perf_counter() - started:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=4, metavar=("MODE", "BASE_URL", "N", "OUT"))
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--old-max", type=int, default=1_000_000, help="largest N for old scan")
    parser.add_argument("--dir", default=None, help="where the output files go (a real disk)")
    args = parser.parse_args()
    if args.child:
        mode, base_url, n, out = args.child
        child(mode, base_url, int(n), out)
        return

    rows: list[tuple[str, str]] = []
    with (
        fixed_answer_server() as (base_url, server),
        tempfile.TemporaryDirectory(dir=args.dir) as tmp,
    ):
        for n in [int(s) for s in args.sizes.split(",")]:
            finished = Path(tmp) / f"finished-{n}.jsonl"

            def measure(mode: str, out: Path, n: int = n) -> tuple[float, float]:
                argv = [sys.executable, __file__, "--child", mode, base_url, str(n), str(out)]
                stdout, rss = run_child(argv)
                return rss, float(stdout.split()[-1])

            measure("write", finished)  # in a child: the parent stays small (see below)
            size_mb = finished.stat().st_size / 1e6
            scan_rss, scan_s = measure("scan", finished)
            old = measure("old", finished) if n <= args.old_max else None
            resume_rss, resume_s = measure("resume", finished)
            finished.unlink()
            fresh = Path(tmp) / f"fresh-{n}.jsonl"
            fresh_rss, fresh_s = measure("fresh", fresh)
            fresh.unlink()
            label = f"{n:>10,} finished ({size_mb:,.0f} MB)"
            rows += [
                (f"{label} resume", f"peak RSS {resume_rss:6.1f} MB   {resume_s:7.1f} s"),
                (f"{label} no resume", f"peak RSS {fresh_rss:6.1f} MB   {fresh_s:7.1f} s"),
                (f"{label} ratio", f"resume/no resume RSS {resume_rss / fresh_rss:.2f}"),
                (
                    f"{label} scan",
                    f"peak RSS {scan_rss:6.1f} MB   {n / scan_s / 1e6:5.2f} M lines/s",
                ),
            ]
            if old is not None:
                old_rss, old_s = old
                rows.append(
                    (
                        f"{label} set of ids (jsonl.scan)",
                        f"peak RSS {old_rss:6.1f} MB   {n / old_s / 1e6:5.2f} M lines/s",
                    )
                )
    rows.append(("targets", f"resume peak <= {TARGET_MB:g} MB at 10M; scan >= 1 M lines/s"))
    report(f"resume memory: batch_to_jsonl(resume=True), server: {server}", rows)


if __name__ == "__main__":
    main()
