"""Hugging Face in and out: ``type: hub`` reads a dataset through ``datasets.load_dataset`` (a
dataset repository folder, or ``org/name`` from the local cache with the Hub offline), by
config, split and streaming, with row ids that shard and resume like a file's; ``type: hf`` is
the saved-dataset input; ``datasets`` is imported only by the features that need it, and its
absence is one sentence naming ``mmirage[hf]``; llm_kit turns a ``Dataset`` into items and
results back into a ``Dataset``.

No test reaches the network: the Hub dataset is a folder made here, or a cache populated here
the way an earlier online load leaves it, read with ``HF_HUB_OFFLINE=1`` and an endpoint that
refuses connections."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from llm_kit import LLM, BatchResult, Message, items_from_dataset, results_to_dataset
from llm_kit.errors import ConfigError as KitConfigError
from llm_kit.errors import MissingExtraError
from mmirage.config import load_mmirage_config_dict
from mmirage.config.errors import ConfigError
from mmirage.config.loading_params import DatasetConfig
from mmirage.core.loader import DataError, open_dataset, shard_dataset
from mmirage.errors import MissingExtra
from mmirage.rundir import _dataset_identity

MMIRAGE = Path(sys.executable).with_name("mmirage")
TEST_KEY = "sk-test-secret-0123456789abcdef"

EN_TRAIN = [("1", "one"), ("2", "two"), ("3", "three"), ("4", "four"), ("5", "five")]
EN_TEST = [("9", "nine")]
FR_TRAIN = [("1", "un"), ("2", "deux")]

CARD = """\
---
configs:
- config_name: en
  default: true
  data_files:
  - split: train
    path: en/train.csv
  - split: test
    path: en/test.csv
- config_name: fr
  data_files:
  - split: train
    path: fr/train.csv
---
# A dataset repository made by the test
"""


def _csv(path: Path, rows: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in rows), encoding="utf-8")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A dataset repository as on the Hub: data files and a card naming two configs."""
    root = tmp_path / "repo"
    _csv(root / "en" / "train.csv", EN_TRAIN)
    _csv(root / "en" / "test.csv", EN_TEST)
    _csv(root / "fr" / "train.csv", FR_TRAIN)
    (root / "README.md").write_text(CARD, encoding="utf-8")
    return root


@pytest.fixture
def datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own ``datasets`` cache (the library read its location when imported)."""
    import datasets

    cache = tmp_path / "hf-datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def _hub(path: str, **options: Any) -> DatasetConfig:
    return DatasetConfig(path=path, type="hub", output_dir="out", **options)


def _rows(source: Any) -> list[tuple[str | None, int, str, str]]:
    return [
        (row.split, row.row_id, str(row.data["id"]), row.data["text"])
        for split in source.splits
        for row in source.iter_rows(split=split)
    ]


# -- type hub, from a dataset repository folder --------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_reads_a_config_and_its_splits(
    repo: Path, datasets_cache: Path, streaming: bool
) -> None:
    source = open_dataset(_hub(str(repo), name="en", streaming=streaming))
    assert source.splits == ["train", "test"]
    assert source.num_rows == 6
    assert _rows(source) == [
        *[("train", n, i, t) for n, (i, t) in enumerate(EN_TRAIN)],
        ("test", 0, "9", "nine"),
    ]
    one = open_dataset(_hub(str(repo), name="fr", split="train", streaming=streaming))
    assert one.splits == [None]  # one split picked: a dataset without splits
    assert _rows(one) == [(None, n, i, t) for n, (i, t) in enumerate(FR_TRAIN)]


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_shards_cover_every_row_once(repo: Path, datasets_cache: Path, streaming: bool) -> None:
    source = open_dataset(_hub(str(repo), name="en", streaming=streaming))
    whole = [(r.split, r.row_id, r.data) for s in source.splits for r in source.iter_rows(split=s)]
    for num_shards in (1, 2, 3, 7):
        parts = [
            (r.split, r.row_id, r.data)
            for k in range(num_shards)
            for r in shard_dataset(source, num_shards, k).iter_rows()
        ]
        assert sorted(parts, key=str) == sorted(whole, key=str)
        assert len(parts) == len(whole)


def test_a_stream_longer_than_its_card_says_is_an_error_not_a_lost_row(
    repo: Path, datasets_cache: Path
) -> None:
    # The card's row count cuts the shards of a stream: a row past it would be in no shard.
    card = CARD.replace(
        "---\n# A",
        "dataset_info:\n- config_name: fr\n  splits:\n  - name: train\n    num_examples: 1\n"
        "---\n# A",
    )
    (repo / "README.md").write_text(card, encoding="utf-8")
    source = open_dataset(_hub(str(repo), name="fr", split="train", streaming=True))
    assert source.num_rows == 1
    with pytest.raises(DataError, match="the stream has more rows than the 1 its dataset card"):
        list(shard_dataset(source, 1, 0).iter_rows())


def test_hub_failure_is_one_sentence_naming_the_dataset(repo: Path, datasets_cache: Path) -> None:
    with pytest.raises(DataError) as failed:
        open_dataset(_hub(str(repo), name="de"), index=3)
    message = str(failed.value)
    assert message.startswith("dataset 3 (loading_params.datasets[3].path = ")
    assert "load_dataset could not load it" in message and "'de'" in message
    assert "\n" not in message


def test_hub_options_belong_to_type_hub_only() -> None:
    config = _pipeline({"path": "org/name", "type": "HF_HUB", "split": "train"})
    assert load_mmirage_config_dict(config).loading_params.datasets[0].type == "hub"
    for option, value in (("name", "en"), ("revision", "v1"), ("split", "train")):
        refused = _pipeline({"path": "d.jsonl", "type": "JSONL", option: value})
        with pytest.raises(ConfigError, match=f"{option}: is an option of type hub, not JSONL"):
            load_mmirage_config_dict(refused)


def test_new_options_leave_an_existing_pipeline_fingerprint_alone() -> None:
    # Published shards are redone when the fingerprint changes: a config written before the
    # hub options must hash as it did (dataset entry: its four fields, nothing more).
    jsonl = DatasetConfig(path="d.jsonl", type="JSONL", output_dir="out")
    assert _dataset_identity(jsonl) == {
        "path": "d.jsonl",
        "type": "JSONL",
        "output_dir": "out",
        "image_base_path": None,
    }
    assert _dataset_identity(_hub("org/name", split="train"))["split"] == "train"


# -- type hf: the saved-dataset input -----------------------------------------------------------


def test_type_hf_reads_a_saved_dataset_like_loadable(tmp_path: Path) -> None:
    import datasets

    saved = tmp_path / "saved"
    datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict({"id": [1, 2], "text": ["a", "b"]})}
    ).save_to_disk(str(saved))
    config = load_mmirage_config_dict(_pipeline({"path": str(saved), "type": "hf"}))
    entry = config.loading_params.datasets[0]
    assert entry.type == "loadable"
    assert _rows(open_dataset(entry)) == [("train", 0, "1", "a"), ("train", 1, "2", "b")]


# -- without the hf extra -------------------------------------------------------------------------


def test_without_datasets_only_its_features_fail_naming_the_extra(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the package were not installed
    for config in (_hub("org/name"), DatasetConfig(str(tmp_path), "loadable", "out")):
        with pytest.raises(MissingExtra) as missing:
            open_dataset(config)
        assert "needs the `mmirage[hf]` extra" in str(missing.value)
        assert "pip install -e '.[hf]'" in str(missing.value)
    with pytest.raises(MissingExtraError, match=r"results_to_dataset needs the `mmirage\[hf\]`"):
        results_to_dataset([])
    # A file input and llm_kit's items need no datasets.
    csv = repo / "en" / "train.csv"
    assert open_dataset(DatasetConfig(str(csv), "CSV", "out")).num_rows == 5
    items = items_from_dataset([{"id": 1, "text": "x"}], id_column="id", prompt="{text}")
    assert [item.id for item in items] == ["1"]


# -- through the CLI, offline, from the local cache ---------------------------------------------

SCRIPT = "def upper(variables):\n    return variables['text'].upper()\n"


def _pipeline(dataset: dict[str, Any], num_shards: int = 1) -> dict[str, Any]:
    return {
        "processors": [{"type": "custom", "script_path": "script.py", "function_name": "upper"}],
        "loading_params": {
            "state_dir": "state",
            "datasets": [{"output_dir": "out", **dataset}],
            "num_shards": num_shards,
            "batch_size": 2,
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}, {"name": "text", "key": "text"}],
            "outputs": [{"name": "loud", "type": "custom"}],
            "output_schema": {"id": "{{ id }}", "loud": "{{ loud }}"},
        },
    }


def _fill_cache_as_a_hub_load_would(repo: Path, cache: Path) -> None:
    """What ``load_dataset("org/name")`` leaves in the ``datasets`` cache online: the prepared
    Arrow files of its default config under ``org___name/default/<version>/<hash>``. Prepared
    here from the repository's files by the same CSV builder (a builder refuses local files
    under a Hub id, so the folder is given its Hub name after)."""
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.csv.csv import Csv

    files = DataFilesDict.from_patterns(
        {"train": ["en/train.csv"], "test": ["en/test.csv"]}, base_path=str(repo)
    )
    builder = Csv(
        cache_dir=str(cache),
        dataset_name="name",
        config_name="default",
        config_id="default",
        data_files=files,
        hash="0123456789abcdef",
    )
    builder.download_and_prepare()
    (cache / "name").rename(cache / "org___name")


def _mmirage(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [str(MMIRAGE)] if MMIRAGE.exists() else [sys.executable, "-m", "mmirage"]
    return subprocess.run(
        [*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _offline_env(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "XDG_CACHE_HOME": str(root / "cache"),
        "HF_HOME": str(root / "hf-home"),
        "HF_DATASETS_CACHE": str(root / "hf-datasets-cache"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",  # refused, should anything try the network
    }


def _published(out: Path, num_shards: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for k in range(num_shards):
        text = (out / f"shard-{k}-of-{num_shards}.jsonl").read_text()
        rows += [json.loads(line) for line in text.splitlines()]
    return rows


@pytest.mark.parametrize("streaming", [False, True])
def test_run_reads_a_hub_dataset_from_the_cache_offline_and_resumes(
    tmp_path: Path, repo: Path, streaming: bool
) -> None:
    _fill_cache_as_a_hub_load_would(repo, tmp_path / "hf-datasets-cache")
    (tmp_path / "script.py").write_text(SCRIPT)
    dataset = {"path": "org/name", "type": "hub", "streaming": streaming}
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(_pipeline(dataset, num_shards=2)))
    env = _offline_env(tmp_path)
    done = _mmirage("run", "pipeline.yaml", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = _published(tmp_path / "out", 2)
    # Shard k holds its part of each split: train rows 0-2 and test row 0, then train 3-4.
    assert [(str(r["id"]), r["loud"]) for r in rows] == [
        ("1", "ONE"), ("2", "TWO"), ("3", "THREE"), ("9", "NINE"), ("4", "FOUR"), ("5", "FIVE"),
    ]  # fmt: skip
    assert [r["__row_key__"] for r in rows] == [
        "0:train:0", "0:train:1", "0:train:2", "0:test:0", "0:train:3", "0:train:4",
    ]  # fmt: skip
    again = _mmirage("run", "pipeline.yaml", cwd=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert _published(tmp_path / "out", 2) == rows


def test_run_offline_without_the_dataset_cached_says_so_in_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(SCRIPT)
    config = _pipeline({"path": "org/absent", "type": "hub"})
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(config))
    done = _mmirage("run", "pipeline.yaml", cwd=tmp_path, env=_offline_env(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert "loading_params.datasets[0].path = 'org/absent'" in errors[0]
    assert "load_dataset could not load it" in errors[0]


# -- llm_kit: a Dataset in, a Dataset out ---------------------------------------------------------


class Verdict(BaseModel):
    echo: str


def test_items_from_a_dataset_and_results_back_as_one(emulator: Any) -> None:
    import datasets

    reviews = datasets.Dataset.from_dict(
        {"rid": [10, 11, 12], "text": ["good", "bad", "fine"], "lang": ["en", "en", "fr"]}
    )
    items = items_from_dataset(
        reviews,
        id_column="rid",
        prompt="Review: {text}",
        system="You judge reviews.",
        keep_columns=["lang"],
    )
    llm = LLM(
        model="test-model",
        message_format="openai",
        base_url=emulator.openai_base_url,
        api_key=TEST_KEY,
        max_tokens=32,
    )

    async def collect() -> list[BatchResult]:
        return [result async for result in llm.batch_stream(items)]

    results = asyncio.run(collect())
    table = results_to_dataset(sorted(results, key=lambda r: r.id))
    assert isinstance(table, datasets.Dataset)
    assert table.column_names[:3] == ["id", "ok", "response"] and "lang" in table.column_names
    assert table["id"] == ["10", "11", "12"] and table["ok"] == [True] * 3
    assert table["response"] == ["echo: Review: good", "echo: Review: bad", "echo: Review: fine"]
    assert table["lang"] == ["en", "en", "fr"]
    assert all(n and n > 0 for n in table["input_tokens"])


def test_results_of_mixed_kinds_still_make_one_dataset() -> None:
    results = [
        BatchResult("a", True, response="text", metadata={"n": 1}),
        BatchResult("b", True, response=Verdict(echo="x")),
        BatchResult("c", False, error="rate limited", error_kind="rate_limit", retryable=True),
    ]
    table = results_to_dataset(results)
    assert table["response"] == ["text", '{"echo":"x"}', None]
    assert table["n"] == [1, None, None]  # a metadata key some results lack
    assert table["retryable"] == [False, False, True]


def test_bad_dataset_rows_are_one_sentence_naming_row_and_column() -> None:
    rows = [{"rid": 1, "text": "a"}, {"rid": None, "text": "b"}]
    with pytest.raises(KitConfigError, match="row at position 1: its 'rid' value None is no id"):
        list(items_from_dataset(rows, id_column="rid", prompt="{text}"))
    with pytest.raises(KitConfigError, match="row '1': the prompt names the column 'body'"):
        list(items_from_dataset(rows, id_column="rid", prompt="{body}"))
    with pytest.raises(KitConfigError, match="has no column 'key' \\(the id_column\\)"):
        list(items_from_dataset(rows, id_column="key", prompt="{text}"))
    clash = [BatchResult("a", True, response="x", metadata={"ok": 1})]
    with pytest.raises(KitConfigError, match="the metadata key 'ok' is also a result column"):
        results_to_dataset(clash)


def test_items_take_a_system_prompt_or_a_prompt_function() -> None:
    rows = [{"rid": 7, "text": "a", "lang": "fr"}]
    (item,) = items_from_dataset(
        rows, id_column="rid", prompt="Say {text}", system="Be brief.", keep_columns=["lang"]
    )
    assert item.id == "7" and item.metadata == {"lang": "fr"}
    assert item.messages == [Message.system("Be brief."), Message.user("Say a")]
    conversation = [Message.system("Only yes or no."), Message.user("Is it a?")]
    (made,) = items_from_dataset(rows, id_column="rid", prompt=lambda row: conversation)
    assert made.messages == conversation  # the function's conversation, as it made it
