"""How long resume takes to decide what to skip in a 1M-line output file.

Target: <= 3 s. Compared with the obvious approach (parse every line fully with orjson).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson

from _common import report
from llm_kit import BatchResult, Usage
from llm_kit.jsonl import encode_line, scan


def write_file(path: Path, n: int) -> None:
    with open(path, "wb") as f:
        for i in range(n):
            ok = i % 50 != 0
            result = BatchResult(
                f"item-{i:07d}",
                ok,
                response="A one-line summary of the row, about as long as a real answer is."
                if ok
                else None,
                error=None if ok else "openai answered HTTP 500: server error",
                error_kind=None if ok else "server_error",
                retryable=not ok,
                usage=Usage(42, 17),
                metadata={"row": i, "source": "bench"},
            )
            f.write(encode_line(result))


def naive(path: Path) -> set[str]:
    with open(path, "rb") as f:
        return {orjson.loads(line)["id"] for line in f}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.jsonl"
        write_file(path, args.lines)
        size_mb = path.stat().st_size / 1e6
        started = time.perf_counter()
        checkpoint = scan(path)
        ours = time.perf_counter() - started
        started = time.perf_counter()
        ids = naive(path)
        baseline = time.perf_counter() - started
    assert len(checkpoint.done) == len(ids) == args.lines
    report(
        f"resume scan: {args.lines:,} lines, {size_mb:.0f} MB",
        [
            ("llm_kit jsonl.scan", f"{ours:.2f} s  (target <= 3 s)"),
            ("full orjson parse per line", f"{baseline:.2f} s"),
            ("ratio ours/full parse", f"{ours / baseline:.2f}"),
        ],
    )


if __name__ == "__main__":
    main()
