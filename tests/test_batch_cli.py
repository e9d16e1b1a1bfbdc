"""``batch_check`` / ``batch_merge`` / ``batch_retry`` as the CLI runs them (printed output and
exit codes) over real HTTP to the emulator; the price table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest

from mmirage.cli.batch_mode import batch_check, batch_merge, batch_retry
from mmirage.core.process.batch import cost
from mmirage.rundir import RunDir
from provider_emulator import EmulatorConfig, running_emulator
from test_batch_collector import (
    KEY,
    SIZES,
    config_data,
    make_config,
    processor_block,
    read_jsonl,
    receipt_files,
    run_all,
    scan_lines,
    source_keys,
)

SUMMARY = "------------ Batch status summary ------------"


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def batch_ids(config: Any) -> list[str]:
    return [line["provider_batch_id"] for line in scan_lines(config)]


def no_key_anywhere(capsys_text: str, *roots: Path) -> None:
    assert KEY not in capsys_text
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                assert KEY.encode() not in path.read_bytes(), path


# -- check ------------------------------------------------------------------------------------


def test_check_prints_each_batch_then_the_summary(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig(seed=1)) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        ids = batch_ids(config)
        assert batch_check(config, "batch-test.yaml") == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for batch_id in ids:
        assert any(line.startswith(f"Batch {batch_id} (openai): completed (") for line in lines)
    n = len(ids)
    assert out.endswith(f"{SUMMARY}\nProvider 'openai' (Total: {n}):\n  - completed: {n}/{n}\n"), (
        out
    )
    no_key_anywhere(out, tmp_path)


def test_check_exits_1_on_a_failed_batch_until_retry_replaced_it(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig(seed=2, batch_failure_rate=0.3)) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        assert batch_check(config) == 1
        assert "  - failed: " in capsys.readouterr().out
        for _ in range(10):
            assert batch_retry(config) == 0
            printed = capsys.readouterr().out
            if "nothing to resubmit" in printed:
                break
            assert "resubmitted " in printed and " failed" in printed
        assert batch_check(config) == 0  # the failed batches' requests were all redone
        out = capsys.readouterr().out
        assert "resubmitted by 'mmirage retry'" in out and "  - failed: " in out
        assert batch_merge(config, str(tmp_path / "merged.jsonl")) == 0
    rows = read_jsonl(tmp_path / "merged.jsonl")
    assert sum(1 for r in rows if r["__errors__"]) == 1  # only the row broken at run time


def test_check_without_receipts_names_the_globs(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = make_config(tmp_path, None, processor=processor_block_offline())
    assert batch_check(config) == 2  # nothing was submitted: the user's move
    err = capsys.readouterr().err
    assert err.startswith("error: no batch receipts found (tried ")
    assert "batch_metadata.text.*.jsonl" in err and err.count("\n") == 1


def processor_block_offline(**fields: Any) -> dict[str, Any]:
    return {"type": "batch_api", "provider": "openai", "model": "gpt-4o-mini", **fields}


def test_check_refuses_a_provider_missing_from_the_config(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    meta = str(tmp_path / "meta" / "batch.jsonl")
    with running_emulator(EmulatorConfig()) as emu:
        config = make_config(
            tmp_path, emu, processor=processor_block(emu, "openai", metadata_output_path=meta)
        )
        run_all(config)
        other = make_config(
            tmp_path / "other",
            emu,
            processor=processor_block(emu, "anthropic", metadata_output_path=meta),
        )
        # Found by the config's globs, another pipeline's receipts are not this one's...
        assert batch_check(other) == 1
        assert "belong to another pipeline" in capsys.readouterr().err
        # ...named by hand, they are checked, and their provider must be in the config.
        receipts = sorted(str(p) for p in (tmp_path / "meta").glob("batch.text.*.jsonl"))
        assert batch_check(other, metadata_paths=receipts) == 1
    err = capsys.readouterr().err
    assert "the receipts name provider 'openai'" in err and "Traceback" not in err


def test_a_missing_key_is_one_sentence_exit_2(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        monkeypatch.delenv("OPENAI_API_KEY")
        assert batch_check(config) == 2
        assert batch_merge(config, str(tmp_path / "m.jsonl")) == 2
    err = capsys.readouterr().err
    assert err.count("error: ") == 2 and "OPENAI_API_KEY" in err and "Traceback" not in err


def test_a_failed_lookup_is_reported_and_exits_1(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        receipt = Path(receipt_files(RunDir.of(config))[0])
        bogus = {**scan_lines(config)[0], "provider_batch_id": "batch_nobody_knows"}
        with open(receipt, "ab") as f:
            f.write(orjson.dumps(bogus) + b"\n")
        assert batch_check(config) == 1
    out = capsys.readouterr().out
    assert "Batch batch_nobody_knows (openai): lookup_failed (" in out
    assert "  - lookup_failed: 1/" in out


def test_check_wait_polls_until_every_batch_ends(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=1.0)) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        assert batch_check(config) == 0
        assert "in_progress" in capsys.readouterr().out  # running batches are not an error
        assert batch_check(config, wait=True, poll_interval=0.1) == 0
    captured = capsys.readouterr()
    n = len(batch_ids(config))
    assert f"  - completed: {n}/{n}" in captured.out
    assert "batches finished" in captured.err  # the progress display, on stderr


def test_dry_run_receipts_are_skipped_even_when_named(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        real = receipt_files(RunDir.of(config))
        base, modality, run_id, _ = real[0].rsplit(".", 3)
        dry = Path(f"{base}.dry-run.{modality}.{run_id}.jsonl")
        line = {**scan_lines(config)[0], "status": "dry_run", "provider_batch_id": "dry-run-x"}
        dry.write_bytes(orjson.dumps(line) + b"\n")
        assert str(dry) not in receipt_files(RunDir.of(config))
        assert batch_check(config, metadata_paths=[*real, str(dry)]) == 0
    assert "dry-run-x" not in capsys.readouterr().out


# -- merge --------------------------------------------------------------------------------------


def test_merge_while_batches_run_writes_a_partial_file_then_wait_completes_it(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged.jsonl"
    with running_emulator(EmulatorConfig(batch_delay_s=1.5)) as emu:
        config = make_config(tmp_path, emu, poll_interval=0.1)
        run_all(config)
        n = len(batch_ids(config))
        assert batch_merge(config, str(out)) == 0
        printed = capsys.readouterr().out
        assert f"{n} of {n} batches still running; the file is partial" in printed
        rows = read_jsonl(out)
        assert [r["__row_key__"] for r in rows] == source_keys()
        pending = [r for r in rows if r["__errors__"] and "__row__" not in r["__errors__"]]
        assert len(pending) == sum(SIZES.values()) - 1
        assert all(v.startswith("pending") for r in pending for v in r["__errors__"].values())

        assert batch_merge(config, str(out), wait=True) == 0
        printed = capsys.readouterr().out
    assert "batches still running" not in printed
    assert "rows: 21 (20 complete, 1 with errors)" in printed
    assert "requests: 40 (40 succeeded, 0 failed, 0 expired" in printed
    assert "tokens: " in printed and "cost: $" in printed and "batch prices" in printed


def test_canceled_batches_are_merged_partially_then_retried(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mmirage.core.process.batch.registry import BatchAdapterRegistry

    out = tmp_path / "merged.jsonl"
    with running_emulator(EmulatorConfig(batch_delay_s=2.0)) as emu:
        config = make_config(tmp_path, emu, poll_interval=0.1)
        run_all(config)
        provider_config = config.processors[0].provider_config  # type: ignore[union-attr]
        adapter = BatchAdapterRegistry.create(provider_config)
        for batch_id in batch_ids(config):
            adapter.cancel_batch(batch_id, provider_config)
        assert batch_merge(config, str(out), wait=True) == 1  # rows without their results
        captured = capsys.readouterr()
        printed = captured.out
        canceled = int(printed.split(" canceled")[0].rsplit(", ", 1)[1])
        assert canceled > 0
        (error,) = [line for line in captured.err.splitlines() if line.startswith("error: ")]
        assert f"{canceled} canceled" in error and "'mmirage retry --config" in error
        assert batch_retry(config) == 0
        assert f"{canceled} canceled" in capsys.readouterr().out
        assert batch_merge(config, str(out), wait=True) == 0
    assert "requests: 40 (40 succeeded" in capsys.readouterr().out


def test_merge_through_a_fresh_process_never_prints_the_key(tmp_path: Path) -> None:
    import yaml

    with running_emulator(EmulatorConfig()) as emu:
        data = config_data(tmp_path, emu)
        path = tmp_path / "batch.yaml"
        path.write_text(yaml.safe_dump(data))
        script = textwrap.dedent(f"""
            import sys
            from mmirage.config import load_mmirage_config
            from mmirage.core.shard.runner import run_shard
            from mmirage.cli.batch_mode import batch_check, batch_merge
            config = load_mmirage_config({str(path)!r})
            for shard in range(2):
                run_shard(config, shard)
            code = batch_check(config, {str(path)!r})
            sys.exit(code or batch_merge(config, {str(tmp_path / "m.jsonl")!r}))
        """)
        env = {**os.environ, "OPENAI_API_KEY": KEY}
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
        )
    assert done.returncode == 0, done.stderr
    assert SUMMARY in done.stdout and "merged 21 rows" in done.stdout
    no_key_anywhere(done.stdout + done.stderr, tmp_path)
    assert len(read_jsonl(tmp_path / "m.jsonl")) == 21


def test_merge_with_one_receipt_reports_the_others_missing(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        text_only = [p for p in receipt_files(RunDir.of(config)) if ".text." in p]
        assert batch_merge(config, str(tmp_path / "m.jsonl"), metadata_paths=text_only) == 1
    rows = read_jsonl(tmp_path / "m.jsonl")
    images = [r for r in rows if r.get("img") and "__row__" not in (r["__errors__"] or {})]
    assert images and all("no batch receipt names" in r["__errors__"]["answer"] for r in images)
    assert "missing" in capsys.readouterr().out


def test_merge_under_a_changed_configuration_sends_to_run_first(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shards were computed under another base_url: merge says to run first (which
    recomputes them, submitting what changed), then merges what the new endpoint answered
    and never polls the old one for batches nobody stands on any more."""
    with running_emulator(EmulatorConfig()) as emu:
        run_all(make_config(tmp_path, emu))
        moved = processor_block(emu, "openai")
        moved["base_url"] = moved["base_url"].replace("127.0.0.1", "localhost")
        changed = make_config(tmp_path, emu, processor=moved)
        assert (
            batch_merge(changed, str(tmp_path / "m.jsonl"), receipt_files(RunDir.of(changed))) == 1
        )
        err = capsys.readouterr().err
        assert "earlier configuration, to another provider or base_url" in err, err
        assert "run 'mmirage run CONFIG' first" in err
        run_all(changed)
        assert (
            batch_merge(changed, str(tmp_path / "m.jsonl"), receipt_files(RunDir.of(changed))) == 0
        )
    rows = read_jsonl(tmp_path / "m.jsonl")
    assert sum(r["__errors__"] is not None for r in rows) == 1  # the row with no question
    assert "40 succeeded" in capsys.readouterr().out  # answered at the new base_url


def test_merge_refuses_unpublished_shards(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        config = make_config(tmp_path, emu)
        run_shard_zero_only(config)
        assert batch_merge(config, str(tmp_path / "m.jsonl")) == 1
    err = capsys.readouterr().err
    assert "shard(s) 1 of 2 are not published yet" in err
    assert not (tmp_path / "m.jsonl").exists()


def run_shard_zero_only(config: Any) -> None:
    from mmirage.core.shard.runner import run_shard

    run_shard(config, 0)


def test_retry_with_nothing_to_do(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        before = emu.stats()["batches"]
        assert batch_retry(config) == 0
        assert emu.stats()["batches"] == before
    assert "nothing to resubmit" in capsys.readouterr().out
    assert (RunDir.of(config).state / "batch" / "results.sqlite").is_file()


def test_retry_reports_request_lines_that_are_gone(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_emulator(EmulatorConfig(batch_failure_rate=1.0)) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        for line in scan_lines(config):
            Path(line["spool_path"]).unlink()
        assert batch_retry(config) == 1
    err = capsys.readouterr().err
    assert "are gone, so its" in err and "Traceback" not in err


# -- prices ----------------------------------------------------------------------------------


def test_prices_match_snapshots_by_longest_prefix() -> None:
    mini = cost.price_for("gpt-4o-mini-2024-07-18")
    assert mini == cost.price_for("gpt-4o-mini") and mini != cost.price_for("gpt-4o")
    assert cost.price_for("claude-haiku-4-5-20251001") == cost.price_for("claude-haiku-4-5")
    assert cost.price_for("some-local-model") is None
    assert cost.usage_cost("gpt-4o-mini", 1_000_000, 1_000_000) == pytest.approx(0.375)


def test_prices_can_be_registered_and_read_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cost.register_price("house-model", 1.0, 2.0)
    try:
        assert cost.usage_cost("house-model-v2", 500_000, 250_000) == pytest.approx(1.0)
    finally:
        cost.unregister_price("house-model")  # registrations stay in this test
    assert cost.price_for("house-model") is None
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"gpt-4o-mini": [0.5, 1.5], "lab": {"input": 3, "output": 4}}))
    monkeypatch.setenv(cost.PRICES_ENV, str(prices))
    assert cost.price_for("gpt-4o-mini") == cost.Price(0.5, 1.5)
    assert cost.price_for("lab-x") == cost.Price(3.0, 4.0)
    prices.write_text(json.dumps({"lab": "cheap"}))
    os.utime(prices, (1, 1))  # a new mtime: read again
    with pytest.raises(cost.PriceFileError, match="must be"):
        cost.price_for("lab")
    monkeypatch.setenv(cost.PRICES_ENV, str(tmp_path / "nope.json"))
    with pytest.raises(cost.PriceFileError, match="cannot be read"):
        cost.price_for("lab")


def test_config_prices_travel_in_the_run_price_book_not_process_wide(
    key: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    price = {"input": 2.0, "output": 4.0}
    with running_emulator(EmulatorConfig()) as emu:
        block = processor_block(emu, "openai", model="house-model-x", price_per_mtok=price)
        config = make_config(tmp_path, emu, processor=block)
        run_all(config)
        assert cost.price_for("house-model-x") is None  # building the processor left no trace
        assert batch_merge(config, str(tmp_path / "m.jsonl"), wait=True) == 0
    printed = capsys.readouterr().out
    tin, tout = (
        int(n.replace(",", ""))
        for n in printed.split("tokens: ")[1].split(" output")[0].split(" input, ")
    )
    assert f"cost: {cost.format_usd((tin * 2 + tout * 4) / 1e6)} at batch prices" in printed
    assert cost.price_for("house-model-x") is None  # nor did the merge
    book = cost.PriceBook.from_config(config)
    assert book.usage_cost("house-model-x", 1_000_000, 1_000_000) == pytest.approx(6.0)


def test_estimate_before_submission_counts_input_only() -> None:
    estimate = cost.estimate_submission("gpt-4o-mini", 4_000_000)
    assert estimate.input_tokens == 1_000_000
    assert estimate.input_cost == pytest.approx(0.075)
    assert "output tokens are not known" in estimate.describe()
    assert "no known batch price" in cost.estimate_submission("mystery", 10).describe()


def test_run_stats_of_a_batch_pipeline_leave_tokens_null_not_zero(tmp_path: Path) -> None:
    """Token counts are unknown at submission: --stats says null, as `mmirage stats` does."""
    import yaml

    with running_emulator(EmulatorConfig()) as emu:
        path = tmp_path / "batch.yaml"
        path.write_text(yaml.safe_dump(config_data(tmp_path, emu)))
        done = subprocess.run(
            [sys.executable, "-m", "mmirage", "run", str(path), "--stats"],
            capture_output=True,
            text=True,
            env={**os.environ, "OPENAI_API_KEY": KEY},
            timeout=120,
        )
    assert done.returncode == 1, done.stderr  # the fixture's one row without a question
    stats = json.loads(done.stdout[done.stdout.index("{") :])
    assert stats["aggregate"]["total_rows_done"] == 21
    assert stats["aggregate"]["total_input_tokens"] is None
    assert {(s["input_tokens"], s["output_tokens"]) for s in stats["per_shard"]} == {(None, None)}


def test_the_originals_collector_module_entry_point_says_which_command_merges() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mmirage.core.process.batch.collector", "--config", "c.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "mmirage merge --config CONFIG" in done.stderr
