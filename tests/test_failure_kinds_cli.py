"""Failures for good through the real CLI: a JSON output cut at the token limit, or one whose
answers never validate, is published with its reason, counted apart from retryable failures
by ``run``, ``check`` and ``stats``, and never bought again by ``mmirage retry``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from provider_emulator import EmulatorConfig, running_emulator
from test_row_retry import mmirage  # the CLI in a subprocess, with a key

ROWS = 6
# output → (its max_new_tokens, the sentence its rows fail with, requests bought per row)
CASES = {
    # Cut: asked once, never again (the same request would be cut at the same place).
    "cut": (
        4,
        "the answer was cut at the token limit (finish_reason 'length'): raise "
        "max_new_tokens (now 4) (truncated)",
        1,
    ),
    # Misses the schema: asked, then re-asked once with the error (validation_retries: 1).
    "picky": (512, "the answer does not match Picky", 2),
}


def pipeline(root: Path, base_url: str, output: str) -> Path:
    rows = root / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(ROWS)))
    config = {
        "processors": [
            {
                "type": "llm",
                "base_url": base_url,
                "model": "echo",
                "validation_retries": 1,
                # The schema held by the model alone: the emulator's off-schema answers are
                # its misses (a form that carries the schema would be found ignored).
                "structured_output": "prompt",
                "default_sampling_params": {"max_new_tokens": CASES[output][0]},
            }
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [{"path": str(rows), "type": "JSONL", "output_dir": str(root / "out")}],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}],
            "outputs": [
                {
                    "name": output,
                    "type": "llm",
                    "output_type": "JSON",
                    "prompt": "Describe row {{ id }} at length.",
                    "output_schema": {"text": "str"},
                },
            ],
            "output_schema": {"row": "{{ id }}", "value": f"{{{{ {output} }}}}"},
        },
    }
    path = root / "kinds.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def published(root: Path) -> list[dict[str, Any]]:
    path = root / "out" / "shard-0-of-1.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("output", list(CASES))
def test_a_failure_for_good_is_reported_as_such_and_not_bought_again(
    tmp_path: Path, output: str
) -> None:
    _, sentence, per_row = CASES[output]
    # The emulator's JSON answers never match the schema (a cut answer stays a cut).
    with running_emulator(EmulatorConfig(invalid_json="always")) as emu:
        config = pipeline(tmp_path, emu.openai_base_url, output)
        ran = mmirage("run", str(config), root=tmp_path)
        bought = ROWS * per_row
        assert emu.stats()["requests"] == bought
        assert ran.returncode == 1, ran.stderr
        assert f"{ROWS} failed for good (validation, truncated, refused…)" in ran.stderr
        rows = published(tmp_path)
        assert len(rows) == ROWS
        for row in rows:
            assert sentence in row["__errors__"][output]
            assert "__retry__" not in row  # not retryable: no marker for 'mmirage retry'

        checked = mmirage("check", str(config), root=tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr  # nothing to retry
        summary = checked.stdout.splitlines()[-1]
        assert summary.endswith(
            f"{ROWS} rows done, {ROWS} failed: {ROWS} for good (validation, truncated, refused…)"
        ), summary
        assert "failed for good" in checked.stderr and "retryable reason" not in checked.stderr

        stats = json.loads(mmirage("stats", str(config), root=tmp_path).stdout)["aggregate"]
        assert stats["total_rows_failed"] == ROWS and stats["total_rows_retryable"] == 0
        assert stats["total_rows_failed_for_good"] == ROWS

        mmirage("retry", str(config), root=tmp_path)
        mmirage("run", str(config), root=tmp_path)
        assert emu.stats()["requests"] == bought  # neither retry nor a rerun bought them again
