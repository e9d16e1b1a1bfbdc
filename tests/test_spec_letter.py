"""The batch page to the letter: token counts unknown until merge are null (not 0) in the
published shards, and a ``metadata_output_path`` naming a folder is refused at load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from batch_spec_support import cli_env, mmirage, read_jsonl, shard_rows, write_yaml
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle
from test_attack_batch_files import KEY, pipeline
from test_batch_spec import read_yaml


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorHandle]:
    with running_emulator(EmulatorConfig(), subprocess=True) as handle:
        yield handle


def test_token_counts_are_null_until_merge(emu: EmulatorHandle, tmp_path: Path) -> None:
    config = pipeline(tmp_path, emu)
    env = cli_env(OPENAI_API_KEY=KEY)
    assert mmirage("run", config, env=env).code == 0
    published = shard_rows(tmp_path / "out")
    assert published and all(row["__usage__"] is None for row in published)  # was 0 / 0
    out = tmp_path / "merged.jsonl"
    assert mmirage("merge", config, "--output-path", out, env=env).code == 0
    assert all(row["input_tokens"] > 0 and "__usage__" not in row for row in read_jsonl(out))


@pytest.mark.parametrize("spelled", ["folder/", "existing"])
def test_a_metadata_output_path_that_names_a_folder_is_refused(
    spelled: str, emu: EmulatorHandle, tmp_path: Path
) -> None:
    config = pipeline(tmp_path, emu)
    (tmp_path / "existing").mkdir()
    data = read_yaml(config)
    folder = f"{tmp_path}/{spelled}"  # pathlib would drop the trailing "/"
    data["processors"][0]["metadata_output_path"] = folder
    write_yaml(config, data)
    refused = mmirage("run", config, "--export-prompts", tmp_path / "prompts", env=cli_env())
    assert refused.code == 2, str(refused)  # before: exit 0, receipts hidden as folder/.text...
    assert "processors[0].metadata_output_path" in refused.err and "is a folder" in refused.err
    assert "batch_metadata.jsonl" in refused.err, str(refused)
    assert not list((tmp_path / "existing").iterdir())
