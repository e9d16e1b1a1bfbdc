"""A batch_api request the provider holds is never submitted again: an edited configuration
recomputes its shards (no refusal), submits exactly the requests whose line changed, and merge
answers every row from the submission of the request it now stands for. Real HTTP to the
emulator, real files; requests counted in the receipts the runs wrote."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from mmirage.config import load_mmirage_config_dict
from mmirage.config.models import MMirageConfig
from mmirage.core.process.batch.errors import CollectorError
from mmirage.core.shard.runner import run_shard
from test_batch_collector import (
    SIZES,
    check_merged,
    config_data,
    merge,
    read_jsonl,
    receipt_ids,
    run_all,
    settled,
)
from test_batch_collector import emu as emu
from test_batch_collector import keys as keys

ROWS = sum(SIZES.values()) - 1  # one row has no question: nothing is sent for it


def configure(tmp_path: Path, emu: Any, edit: Any = None) -> MMirageConfig:
    data = config_data(tmp_path, emu)
    if edit is not None:
        data = copy.deepcopy(data)
        edit(data)
    return load_mmirage_config_dict(data, source="batch-test.yaml", env={})


def outputs(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {o["name"]: o for o in data["processing_params"]["outputs"]}


def reprompt(text: str) -> Any:
    def edit(data: dict[str, Any]) -> None:
        outputs(data)["answer"]["prompt"] = text + "{{ question }}"

    return edit


def new_summary(data: dict[str, Any]) -> None:
    data["processing_params"]["output_schema"]["summary"] = "{{ answer }} <- {{ question }}"


def submitted(config: MMirageConfig, before: list[str]) -> list[str]:
    """The custom_ids the receipts name that ``before`` did not (a resubmission too)."""
    now = receipt_ids(config)
    assert now[: len(before)] == before  # receipts are only ever appended
    return now[len(before) :]


def test_an_output_schema_edit_submits_nothing_and_merges_with_the_new_schema(
    emu: Any, keys: None, tmp_path: Path
) -> None:
    config = configure(tmp_path, emu)
    run_all(config)
    merge(config, tmp_path / "first.jsonl")
    paid = receipt_ids(config)

    edited = configure(tmp_path, emu, new_summary)
    run_all(edited)  # computed again, not refused
    assert submitted(edited, paid) == []
    totals = merge(edited, tmp_path / "second.jsonl")
    assert settled(totals)
    for row in read_jsonl(tmp_path / "second.jsonl"):
        if row["__errors__"] is None:
            assert row["summary"] == f"{row['answer']} <- {row['q']}"
            assert row["answer"] == f"echo: Answer: {row['q']}"


def test_a_prompt_edit_submits_that_output_once_per_row_and_never_mixes_answers(
    emu: Any, keys: None, tmp_path: Path
) -> None:
    config = configure(tmp_path, emu)
    run_all(config)
    merge(config, tmp_path / "first.jsonl")  # the old answers are in the results store
    paid = receipt_ids(config)

    edited = configure(tmp_path, emu, reprompt("Reply: "))
    run_all(edited)
    again = submitted(edited, paid)
    assert len(again) == len(set(again)) == ROWS
    assert all(cid.startswith("answer-") for cid in again)

    merge(edited, tmp_path / "second.jsonl")
    rows = read_jsonl(tmp_path / "second.jsonl")
    for row in rows:
        if row["__errors__"] is None:
            assert row["answer"] == f"echo: Reply: {row['q']}"  # never the old prompt's
            assert row["label"] == row["facts"]["label"]

    # Back to the first prompt: the results store holds the second prompt's answers under
    # the same ids now, so the first prompt's requests are submitted again (and never mixed).
    run_all(config)
    back = submitted(config, paid + again)
    assert sorted(back) == sorted(again)
    merge(config, tmp_path / "third.jsonl")
    check_merged(read_jsonl(tmp_path / "third.jsonl"), "openai")


def test_recompute_submits_nothing_and_fresh_submits_everything(
    emu: Any, keys: None, tmp_path: Path
) -> None:
    config = configure(tmp_path, emu)
    run_all(config)
    paid = receipt_ids(config)
    for shard in range(config.loading_params.num_shards):
        report = run_shard(config, shard, force=True)
        assert any("0 request(s) sent" in note for note in report.notes), report.notes
    assert submitted(config, paid) == []

    for shard in range(config.loading_params.num_shards):
        run_shard(config, shard, fresh=True)
    assert sorted(submitted(config, paid)) == sorted(paid)
    merge(config, tmp_path / "merged.jsonl")
    check_merged(read_jsonl(tmp_path / "merged.jsonl"), "openai")


def test_a_run_killed_before_the_store_knew_its_batches_still_submits_nothing_again(
    emu: Any, keys: None, tmp_path: Path
) -> None:
    """The batch was created and its receipt written, then the process died before the
    answer store was told: the chunk's own files tell the next run."""
    config = configure(tmp_path, emu)
    run_all(config)
    paid = receipt_ids(config)
    state = Path(config.loading_params.state_dir)
    for marker in state.rglob("chunk-*.remembered"):
        marker.unlink()
    for answers in state.rglob("answers/*"):
        answers.unlink()  # the store never heard of the batches

    edited = configure(tmp_path, emu, new_summary)
    run_all(edited)
    assert submitted(edited, paid) == []
    assert list(state.rglob("chunk-*.remembered"))  # told, this time
    edited_again = configure(tmp_path, emu, reprompt("Once more: "))
    run_all(edited_again)  # and the store now knows them: only `answer` is sent
    assert {cid.split("-")[0] for cid in submitted(edited_again, paid)} == {"answer"}


def test_merge_refuses_shards_computed_under_another_configuration(
    emu: Any, keys: None, tmp_path: Path
) -> None:
    run_all(configure(tmp_path, emu))
    edited = configure(tmp_path, emu, reprompt("Reply: "))
    with pytest.raises(CollectorError, match="computed under another configuration"):
        merge(edited, tmp_path / "merged.jsonl")
    assert not (tmp_path / "merged.jsonl").exists()


def test_the_same_run_started_again_resumes_its_fresh_work_instead_of_starting_over(
    emu: Any, keys: None, tmp_path: Path
) -> None:
    """A requeued SLURM task runs the same command (same --run-id, same --fresh) again."""
    config = configure(tmp_path, emu)
    run_all(config)
    paid = receipt_ids(config)
    first = run_shard(config, 0, fresh=True, run_id="r1")
    sent = submitted(config, paid)
    assert sent and not first.skipped
    again = run_shard(config, 0, fresh=True, run_id="r1")  # the requeued task
    assert again.skipped and submitted(config, paid) == sent
    run_shard(config, 0, fresh=True, run_id="r2")  # a new --fresh run asks again
    assert len(submitted(config, paid)) == 2 * len(sent)
