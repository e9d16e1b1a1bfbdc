"""Print where the quickstart's output is and its labelled rows (run by `make demo`)."""

from __future__ import annotations

import sys
from pathlib import Path

OUTPUT = Path("out/quickstart/data")
MERGED = OUTPUT / "merged"

if __name__ == "__main__":
    if not MERGED.is_dir():
        sys.exit(f"no merged dataset in {MERGED}: did `mmirage run` fail?")
    from datasets import load_from_disk  # the original's output format

    rows = load_from_disk(str(MERGED))
    failed = sum(1 for errors in rows["__errors__"] if errors)
    shards = sorted(p.name for p in OUTPUT.glob("shard-*"))
    print(f"\n{len(rows)} rows ({failed} failed), shards {', '.join(shards)} in {OUTPUT}")
    print(f"merged dataset, for datasets.load_from_disk: {MERGED}\n")
    for row in rows:
        print(f"  {row['sentiment'] or '(failed)':<9} {row['review']}")
