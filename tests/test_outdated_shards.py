"""A pipeline edited after its shards were published: ``check`` shows them ``outdated``, a live
``merge`` refuses them (it merged the old rows before, exit 0), and ``retry`` or ``run``
computes them again."""

from __future__ import annotations

import json
from pathlib import Path

from batch_spec_support import cli_env, mmirage
from test_retry_cli import cli_config, published_keys


def edit_schema(config: Path) -> None:
    data = json.loads(config.read_text())
    data["processing_params"]["output_schema"] = {"loud": "{{ loud }}!"}
    config.write_text(json.dumps(data))


def test_an_edited_pipeline_is_outdated_until_computed_again(tmp_path: Path) -> None:
    config = cli_config(tmp_path, execution={"merge": False})
    assert mmirage("run", config, env=cli_env()).code == 0
    edit_schema(config)
    hint = (
        "was computed under another configuration (or is being computed again): "
        f"'mmirage run {config}'"
    )

    check = mmirage("check", config, env=cli_env())
    assert check.code == 1, str(check)
    assert check.out.count("outdated") == 3  # two shard lines and the summary
    assert f"shard 0 {hint}" in check.err and f"shard 1 {hint}" in check.err

    merged = mmirage("merge", config, "--format", "jsonl", env=cli_env())
    assert merged.code == 1, str(merged)
    assert f"shard 0 {hint}" in merged.err and "then merge" in merged.err
    assert not list(tmp_path.glob("out/merged*"))

    retried = mmirage("retry", config, env=cli_env())
    assert retried.code == 0 and json.loads(retried.out)["successful"] == 2, str(retried)
    assert mmirage("check", config, env=cli_env()).code == 0
    assert mmirage("merge", config, "--format", "jsonl", env=cli_env()).code == 0
    (out,) = tmp_path.glob("out/merged*")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(published_keys(tmp_path)) and all(r["loud"].endswith("!") for r in rows)
