"""``mmirage merge`` trusts only what the run itself wrote: the real command line in a
subprocess, over real HTTP to the emulator.

* a value that looks like a placeholder (in a dataset column, or in a live model's answer) is
  data, never filled with another row's result;
* a result download that is empty, cut off or not UTF-8 is downloaded again, never stored as
  the batch's results (so ``retry`` never buys again what the provider did answer);
* ``merge`` exits 1 while requests have no result, ``check`` when no receipt is found;
* two merges at once on a fresh results store both succeed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batch_spec_support import (
    MMIRAGE,
    PLACEHOLDER,
    REPO,
    batches_created,
    cli_env,
    mmirage,
    read_jsonl,
    request_totals,
    shard_rows,
    write_rows,
    write_yaml,
)
from mmirage.cli.batch_mode import batch_merge, batch_retry
from mmirage.core.process.batch import fetching
from mmirage.core.process.batch.collector import open_store
from mmirage.rundir import RunDir
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle
from test_batch_collector import ENV, SIZES, config_data, make_config, run_all

KEY = "sk-merge-safety-7788"
MODEL = "gpt-4o-mini"
PROC = {"type": "batch_api", "provider": "openai", "model": MODEL}


@pytest.fixture(scope="module")
def verbatim() -> Iterator[EmulatorHandle]:
    """Answers each prompt with the prompt itself: a test says what the model answers."""
    with running_emulator(EmulatorConfig(responder="verbatim"), subprocess=True) as emu:
        yield emu


def env() -> dict[str, str]:
    return cli_env(OPENAI_API_KEY=KEY)


def live_and_batch_config(tmp_path: Path, emu: EmulatorHandle, rows: list[dict[str, Any]]) -> Path:
    """A live ``llm`` output (``draft``: says ``say``) then a ``batch_api`` one (``answer``)."""
    return write_yaml(
        tmp_path / "spoof.yaml",
        {
            "processors": [
                {
                    "type": "llm",
                    "model": MODEL,
                    "base_url": emu.openai_base_url,
                    "message_format": "openai",
                },
                {
                    "type": "batch_api",
                    "provider": "openai",
                    "model": MODEL,
                    "base_url": emu.openai_base_url,
                },
            ],
            "loading_params": {
                "datasets": [
                    {
                        "path": write_rows(tmp_path / "rows.jsonl", rows),
                        "type": "JSONL",
                        "output_dir": str(tmp_path / "out"),
                    }
                ],
                "num_shards": 1,
                "state_dir": str(tmp_path / "state"),
                "output_format": "jsonl",
            },
            "processing_params": {
                "inputs": [
                    {"name": "question", "key": "q"},
                    {"name": "note", "key": "note"},
                    {"name": "say", "key": "say"},
                ],
                "outputs": [
                    {"name": "draft", "type": "llm", "prompt": "{{ say }}"},
                    {"name": "answer", "type": "batch_api", "prompt": "Answer: {{ question }}"},
                ],
                "output_schema": {
                    "question": "{{ question }}",
                    "note": "{{ note }}",
                    "draft": "{{ draft }}",
                    "answer": "{{ answer }}",
                },
            },
        },
    )


def test_placeholder_look_alikes_in_data_or_live_answers_are_left_as_they_are(
    verbatim: EmulatorHandle, tmp_path: Path
) -> None:
    spoof_data = f"{PLACEHOLDER}answer-text-0"  # row 0's request, named by row 3's data
    spoof_live = f"{PLACEHOLDER}answer-text-1"  # what the live model answers for row 2
    rows = [{"q": f"question {i}", "note": f"note {i}", "say": f"hello {i}"} for i in range(4)]
    rows[3]["note"] = spoof_data
    rows[2]["say"] = spoof_live
    config = live_and_batch_config(tmp_path, verbatim, rows)
    run = mmirage("run", "--config", config, env=env())
    assert run.code == 0, str(run)
    out = tmp_path / "merged.jsonl"
    merge = mmirage("merge", "--config", config, "--output-path", out, env=env())
    assert merge.code == 0, str(merge)

    merged = read_jsonl(out)
    assert [r["answer"] for r in merged] == [f"Answer: question {i}" for i in range(4)]
    assert merged[3]["note"] == spoof_data  # data, kept as it was
    assert merged[2]["draft"] == spoof_live  # the live model's answer, kept as it was
    assert [r["__errors__"] for r in merged] == [None] * 4
    # One batch request per row, each row's tokens counted once.
    assert request_totals(merge.out)["total"] == 4, merge.out
    # A row's tokens: its live output's plus its batch request's. In the shard, __usage__ is
    # null (unknown until merge) and the live output's count rides with the variables.
    published = shard_rows(tmp_path / "out")
    assert all(r["__usage__"] is None for r in published)
    live = {r["__row_key__"]: r["__vars__"]["__usage__"][0] for r in published}
    assert all(live.values()) and "__usage__" not in merged[0]
    batch = {r["input_tokens"] - live[r["__row_key__"]] for r in merged}
    assert len(batch) == 1 and batch.pop() > 0, merged  # the answers' prompts: same length


# -- damaged result downloads -------------------------------------------------------------------

REQUESTS = 2 * (sum(SIZES.values()) - 1)  # two outputs per row; one row fails at run time


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetching, "RETRY_DELAYS", (0.0,) * len(retry_delays()), raising=False)


def retry_delays() -> tuple[float, ...]:
    return tuple(getattr(fetching, "RETRY_DELAYS", (1.0, 2.0, 4.0)))


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_damaged_downloads_are_downloaded_again_and_retry_buys_nothing(
    provider: str,
    no_backoff: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV[provider], KEY)
    # One empty, one cut off, one with invalid UTF-8: the first three result downloads.
    faults = EmulatorConfig(seed=4, batch_damaged_downloads=3)
    with running_emulator(faults, subprocess=True) as emu:
        config = make_config(tmp_path, emu, provider)
        run_all(config)
        submitted = batches_created(emu, provider)
        assert batch_merge(config, tmp_path / "merged.jsonl") == 0
        out = capsys.readouterr().out
        assert f"requests: {REQUESTS} ({REQUESTS} succeeded, 0 failed" in out, out
        assert batch_retry(config) == 0
        assert "nothing to resubmit" in capsys.readouterr().out
        assert batches_created(emu, provider) == submitted  # no request bought twice


def test_a_download_still_damaged_after_the_retries_is_not_stored(
    no_backoff: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(ENV["openai"], KEY)
    tries = len(retry_delays()) + 1
    with running_emulator(
        EmulatorConfig(seed=4, batch_damaged_downloads=tries + 1), subprocess=True
    ) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        submitted = batches_created(emu)
        assert batch_merge(config, tmp_path / "merged.jsonl") == 1
        captured = capsys.readouterr()
        (error,) = [line for line in captured.err.splitlines() if line.startswith("error: ")]
        assert "rerun merge to download it again" in error and "nothing of it was stored" in error
        with open_store(RunDir.of(config)) as store:
            assert sum(not b.fetched for b in store.batches()) == 1
        # retry downloads that batch again (whole now) and finds nothing to resubmit.
        assert batch_retry(config) == 0
        assert "nothing to resubmit" in capsys.readouterr().out
        assert batches_created(emu) == submitted
        assert batch_merge(config, tmp_path / "merged.jsonl") == 0
        assert f"({REQUESTS} succeeded" in capsys.readouterr().out


# -- exit codes -----------------------------------------------------------------------------------


def test_merge_with_failed_requests_exits_1_and_names_retry(tmp_path: Path) -> None:
    with running_emulator(
        EmulatorConfig(seed=8, batch_item_error_rate=0.5), subprocess=True
    ) as emu:
        config = write_yaml(tmp_path / "batch.yaml", config_data(tmp_path, emu))
        run = mmirage("run", "--config", config, env=env())
        assert "Traceback" not in run.err, str(run)  # exit 1: one row lacks its input
        merge = mmirage(
            "merge", "--config", config, "--output-path", tmp_path / "m.jsonl", env=env()
        )
    assert merge.code == 1, str(merge)
    assert "Traceback" not in merge.err
    (error,) = merge.error_lines
    failed = request_totals(merge.out)["failed"]
    assert failed > 0 and error.startswith(f"error: {failed} request(s) have no result"), error
    assert f"'mmirage retry --config {config}' resubmits them" in error
    assert len(read_jsonl(tmp_path / "m.jsonl")) == sum(SIZES.values())  # still written


def test_check_exits_1_when_the_files_named_hold_no_receipt(tmp_path: Path) -> None:
    config = write_yaml(tmp_path / "batch.yaml", config_data(tmp_path, None, processor=PROC))
    not_a_receipt = write_rows(tmp_path / "rows.jsonl", [{"q": "a question"}])
    dry_run = write_rows(
        tmp_path / "batch_metadata.dry-run.text.abc123.jsonl",
        [
            {
                "provider": "openai",
                "provider_batch_id": "dry-run-text-s0-chunk-000001",
                "status": "dry_run",
                "custom_id_to_source_index": {"answer-text-0": 0},
            }
        ],
    )
    for path in (not_a_receipt, dry_run):
        check = mmirage("check", "--config", config, "--metadata-path", path, env=env())
        assert check.code == 1, str(check)
        assert check.error_lines == [
            f"error: no batch receipt found in {path} (dry-run receipts are skipped); name the "
            "<metadata_output_path>.<modality>.<run_id>.jsonl files that 'mmirage run' wrote"
        ], str(check)


# -- concurrent merges ----------------------------------------------------------------------------


def test_two_concurrent_merges_on_a_fresh_store_both_succeed(tmp_path: Path) -> None:
    rows = 150
    with running_emulator(EmulatorConfig(seed=5), subprocess=True) as emu:
        # One request per batch: many batches to record and download, a wide window to race.
        config = write_yaml(
            tmp_path / "batch.yaml",
            {
                "processors": [
                    {**PROC, "base_url": emu.openai_base_url, "max_requests_per_chunk": 1}
                ],
                "loading_params": {
                    "datasets": [
                        {
                            "path": write_rows(
                                tmp_path / "rows.jsonl", [{"q": f"q{i}"} for i in range(rows)]
                            ),
                            "type": "JSONL",
                            "output_dir": str(tmp_path / "out"),
                        }
                    ],
                    "num_shards": 1,
                    "state_dir": str(tmp_path / "state"),
                    "output_format": "jsonl",
                },
                "processing_params": {
                    "inputs": [{"name": "question", "key": "q"}],
                    "outputs": [
                        {"name": "answer", "type": "batch_api", "prompt": "{{ question }}"}
                    ],
                    "output_schema": {"answer": "{{ answer }}"},
                },
            },
        )
        run = mmirage("run", "--config", config, env=env())
        assert run.code == 0, str(run)
        assert not list((tmp_path / "state").rglob("results.sqlite"))  # a fresh store
        outputs = [tmp_path / "one.jsonl", tmp_path / "two.jsonl"]
        merges = [
            subprocess.Popen(
                [MMIRAGE, "merge", "--config", str(config), "--output-path", str(out)],
                cwd=REPO,
                env=env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for out in outputs
        ]
        done = [(*m.communicate(timeout=300), m.returncode) for m in merges]
    for out, err, code in done:
        assert code == 0 and "Traceback" not in err and "UNIQUE" not in err, (code, out, err)
        assert f"requests: {rows} ({rows} succeeded" in out, out
    assert outputs[0].read_bytes() == outputs[1].read_bytes()
