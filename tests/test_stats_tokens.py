"""``mmirage stats`` prints no token counts for batch shards (they are known only once merge
has the results), and keeps live shards' counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmirage.core.merge.shards import stats_report
from mmirage.rundir import RunDir
from provider_emulator import EmulatorConfig, running_emulator
from test_batch_collector import KEY, make_config, run_all


def test_batch_shards_have_no_token_counts_before_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with running_emulator(EmulatorConfig()) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
    report = stats_report(config, RunDir.of(config))
    for entry in report["per_shard"]:
        assert entry["state"] == "success"
        for counters in (entry, entry["stats"], *entry["published"]):
            assert counters["input_tokens"] is None and counters["output_tokens"] is None
    aggregate = report["aggregate"]
    assert aggregate["total_input_tokens"] is None and aggregate["total_output_tokens"] is None
    assert aggregate["output_tokens_per_sec"] is None
    assert aggregate["total_rows"] > 0  # the rest is still reported
