"""Print where the quickstart's output is and its labelled rows (run by `make demo`)."""

from __future__ import annotations

import sys
from pathlib import Path

OUTPUT = Path("out/quickstart/data")
MERGED = OUTPUT / "merged"

if __name__ == "__main__":
    if not MERGED.is_dir():
        sys.exit(f"no merged dataset in {MERGED}: did `mmirage run` fail?")
    try:
        from datasets import load_from_disk  # the original's output format (the hf extra)

        rows = list(load_from_disk(str(MERGED)))
    except ImportError:  # a light install: the same files, read with pyarrow
        from mmirage.core.writer.formats import iter_rows

        rows = [row for batch in iter_rows(MERGED) for row in batch]
    failed = sum(1 for row in rows if row["__errors__"])
    shards = sorted(p.name for p in OUTPUT.glob("shard-*"))
    print(f"\n{len(rows)} rows ({failed} failed), shards {', '.join(shards)} in {OUTPUT}")
    print(f"merged dataset, for datasets.load_from_disk: {MERGED}\n")
    for row in rows:
        print(f"  {row['sentiment'] or '(failed)':<9} {row['review']}")
