"""Damaged files of a ``batch_api`` pipeline, through the real command line (``mmirage run``,
``check``, ``merge``, ``retry`` in subprocesses) over real HTTP to the emulator.

* a published shard emptied, with its last line blanked, or (HF) half zeroed: ``merge``
  and ``check`` verify it as they do for a live pipeline (size and rows; merge also the
  checksum), exit 1 with one sentence naming the shard file and what to do, and following
  that advice brings every row back without buying a batch again;
* a deleted receipt file: its batches are read from the chunks' ``.done`` markers, so
  ``check``, ``merge`` and ``retry`` still reach every paid batch, and ``run`` submits nothing
  again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from batch_spec_support import (
    Cli,
    batches_created,
    cli_env,
    mmirage,
    read_jsonl,
    request_totals,
    write_rows,
    write_yaml,
)
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle

KEY = "sk-attack-batch-files-5151"
ROWS, PER_CHUNK = 60, 10  # six batches
REPAIR = "run 'mmirage run CONFIG --shard-id 0 --force-retry'"


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorHandle]:
    with running_emulator(EmulatorConfig(seed=31), subprocess=True) as handle:
        yield handle


def env() -> dict[str, str]:
    return cli_env(OPENAI_API_KEY=KEY)


def pipeline(root: Path, emu: EmulatorHandle, output_format: str = "jsonl") -> Path:
    """60 rows, one batch_api output, one shard: six batches of ten requests."""
    rows = [{"q": f"question {i}"} for i in range(ROWS)]
    return write_yaml(
        root / "config.yaml",
        {
            "processors": [
                {
                    "type": "batch_api",
                    "provider": "openai",
                    "model": "gpt-4o-mini",
                    "base_url": emu.openai_base_url,
                    "metadata_output_path": str(root / "meta" / "batch_metadata.jsonl"),
                    "max_requests_per_chunk": PER_CHUNK,
                }
            ],
            "loading_params": {
                "datasets": [
                    {
                        "path": write_rows(root / "rows.jsonl", rows),
                        "type": "JSONL",
                        "output_dir": str(root / "out"),
                    }
                ],
                "num_shards": 1,
                "state_dir": str(root / "state"),
                "output_format": output_format,
            },
            "processing_params": {
                "inputs": [{"name": "q", "key": "q"}],
                "outputs": [{"name": "answer", "type": "batch_api", "prompt": "Say {{ q }}"}],
                "output_schema": {"q": "{{ q }}", "answer": "{{ answer }}"},
            },
        },
    )


def submitted(root: Path, emu: EmulatorHandle, output_format: str = "jsonl") -> Path:
    config = pipeline(root, emu, output_format)
    before = batches_created(emu)
    run = mmirage("run", config, env=env())
    assert run.code == 0, str(run)
    assert batches_created(emu) - before == ROWS // PER_CHUNK
    return config


def merged(config: Path, out: Path) -> Cli:
    return mmirage("merge", config, "--output-path", out, env=env())


def assert_all_rows_answered(result: Cli, out: Path) -> None:
    assert result.code == 0, str(result)
    assert request_totals(result.out)["succeeded"] == ROWS, result.out
    rows = read_jsonl(out)
    assert [r["q"] for r in rows] == [f"question {i}" for i in range(ROWS)]
    assert all(r["answer"] and not r.get("__errors__") for r in rows), rows


def one_error(result: Cli) -> str:
    assert "Traceback" not in result.err, str(result)
    (line,) = result.error_lines
    return line


# -- damaged published shards -----------------------------------------------------------------


def empty(shard: Path) -> None:
    shard.write_bytes(b"")


def blank_last_line(shard: Path) -> None:
    """Spaces in place of the last row: same size, same line count, one row fewer."""
    data = shard.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    shard.write_bytes(data[:start] + b" " * (len(data) - start - 1) + b"\n")


def zero_second_half(shard: Path) -> None:
    """The second half of each of the HF shard's Arrow files becomes zeros (same size)."""
    for arrow in sorted(shard.glob("*.arrow")):
        data = arrow.read_bytes()
        half = len(data) // 2
        arrow.write_bytes(data[:half] + bytes(len(data) - half))


DAMAGES = {
    "emptied": ("jsonl", empty),
    "blanked_last_line": ("jsonl", blank_last_line),
    "half_zeroed_hf": ("hf", zero_second_half),
}


def published_shard(root: Path, output_format: str) -> Path:
    return root / "out" / ("shard-0-of-1" + (".jsonl" if output_format == "jsonl" else ""))


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_merge_refuses_a_damaged_shard_and_its_advice_repairs_it_without_buying_again(
    damage: str, emu: EmulatorHandle, tmp_path: Path
) -> None:
    output_format, spoil = DAMAGES[damage]
    config = submitted(tmp_path, emu, output_format)
    shard = published_shard(tmp_path, output_format)
    spoil(shard)
    out = tmp_path / "merged.jsonl"

    refused = merged(config, out)
    assert refused.code == 1, str(refused)
    error = one_error(refused)
    assert error.startswith(f"error: published shard {shard} "), error
    assert REPAIR in error, error
    assert not out.exists()  # no merged file that looks complete

    bought = batches_created(emu)
    repaired = mmirage("run", config, "--shard-id", "0", "--force-retry", env=env())
    assert repaired.code == 0, str(repaired)
    assert batches_created(emu) == bought  # the paid answers are reused, none bought again
    assert_all_rows_answered(merged(config, out), out)


def cut_in_half(shard: Path) -> None:
    for arrow in sorted(shard.glob("*.arrow")):
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])


# ``check`` verifies as a live check does, without a checksum (size and rows): an edit that
# keeps both is ``merge``'s to find (above).
CHECKED_DAMAGES = {"emptied": DAMAGES["emptied"], "cut_hf": ("hf", cut_in_half)}


@pytest.mark.parametrize("damage", list(CHECKED_DAMAGES))
def test_check_names_a_damaged_shard(damage: str, emu: EmulatorHandle, tmp_path: Path) -> None:
    output_format, spoil = CHECKED_DAMAGES[damage]
    config = submitted(tmp_path, emu, output_format)
    healthy = mmirage("check", config, env=env())
    assert healthy.code == 0, str(healthy)
    shard = published_shard(tmp_path, output_format)
    spoil(shard)

    checked = mmirage("check", config, env=env())
    assert checked.code == 1, str(checked)
    assert "completed: 6/6" in checked.out, checked.out  # the batches are still reported
    error = one_error(checked)
    assert error.startswith(f"error: shard 0: published shard {shard} holds "), error
    assert "bytes" in error and "were published" in error, error
    assert REPAIR in error, error


def test_retry_names_a_damaged_shard_and_how_to_repair_it(
    emu: EmulatorHandle, tmp_path: Path
) -> None:
    config = submitted(tmp_path, emu)
    shard = published_shard(tmp_path, "jsonl")
    empty(shard)
    retried = mmirage("retry", config, "-y", env=env())
    assert retried.code == 1, str(retried)
    # Before: only "1 shard(s) have not succeeded", naming neither the shard nor the repair.
    damage = next(line for line in retried.error_lines if "published shard" in line)
    assert damage.startswith(f"error: shard 0: published shard {shard} holds "), damage
    assert REPAIR in damage, damage


# -- a deleted receipt file -------------------------------------------------------------------


def test_a_deleted_receipt_is_rebuilt_from_the_chunk_markers(
    emu: EmulatorHandle, tmp_path: Path
) -> None:
    config = submitted(tmp_path, emu)
    (receipt,) = (tmp_path / "meta").glob("batch_metadata.text.*.jsonl")
    receipt.unlink()
    bought = batches_created(emu)
    rebuilt = (
        f"no text receipt file of run {receipt.name.split('.')[-2]} was found (deleted or "
        "moved); its 6 batch(es) are read from their chunk markers under "
    )

    checked = mmirage("check", config, env=env())
    assert checked.code == 0, str(checked)
    assert "completed: 6/6" in checked.out, checked.out

    out = tmp_path / "merged.jsonl"
    merge = merged(config, out)
    assert_all_rows_answered(merge, out)

    retried = mmirage("retry", config, env=env())
    assert retried.code == 0, str(retried)
    assert "nothing to resubmit" in retried.out, retried.out

    rerun = mmirage("run", config, env=env())
    assert rerun.code == 0, str(rerun)
    assert batches_created(emu) == bought  # nothing paid for is submitted again
    for result in (checked, merge, retried):
        assert rebuilt in result.err, str(result)
        assert "nothing needs submitting again" in result.err, str(result)
        assert not result.error_lines, str(result)
