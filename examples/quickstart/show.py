"""Print where the quickstart's output is and two of its rows (run by `make demo`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUTPUT = Path("out/quickstart/data")

if __name__ == "__main__":
    files = sorted(OUTPUT.glob("shard-*.jsonl"))
    if not files:
        sys.exit(f"no published shard in {OUTPUT}: did `mmirage run` fail?")
    rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    failed = sum(1 for row in rows if row.get("__errors__"))
    where = ", ".join(str(f) for f in files)
    print(f"\n{len(rows)} rows ({failed} failed) in {where}; two of them:")
    if (OUTPUT / "merged").is_dir():
        print(f"merged dataset, for datasets.load_from_disk: {OUTPUT / 'merged'}")
    for row in rows[:2]:
        print(json.dumps({"text": row["text"], "conversations": row["conversations"]}, indent=2))
