"""Every benchmark, one after the other (about half an hour)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SCRIPTS = [
    "live_overhead.py",
    "resume_scan.py",
    "live_memory.py",
    "resume_memory.py",
    "pacing.py",
    "sporadic_429.py",
    "batch_api.py",
    "pipeline_overhead.py",
    "pipeline_instructions.py",
    "pipeline_memory.py",
    "cli_startup.py",
    "mmirage_batch.py",
    "slurm_overhead.py",
    "stop_waste.py",
    "pay_once.py",
]

if __name__ == "__main__":
    for script in SCRIPTS:
        subprocess.run([sys.executable, str(HERE / script)], check=True)
