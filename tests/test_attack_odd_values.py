"""Odd values in answers and rows: each is that row's value or error, never the shard's end.

* an answer holding a lone UTF-16 surrogate (as a JSON escape, in a JSON answer or in the
  provider's body around a plain-text one) is kept, the surrogate replaced by U+FFFD where
  llm_kit decodes it, live and in a batch, and read back so from the answer and results stores;
* an image path that the OS refuses (a NUL byte, a name too long, a directory, a file it may
  not read) is that row's error;
* a row refused for its image keeps its inputs and the fields that read no failed value;
* a source column with a name mmirage reserves (``__vars__``, ``__errors__``...) is refused at
  load, in one sentence naming the column and the file.

The real ``mmirage`` command line in a subprocess, over real HTTP to the emulator.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from batch_spec_support import cli_env, mmirage, read_jsonl, shard_rows, write_rows, write_yaml
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle

KEY = "sk-odd-values-5d21"
MODEL = "gpt-4o-mini"
FFFD = "\ufffd"


@pytest.fixture(scope="module")
def escapes() -> Iterator[EmulatorHandle]:
    """Answers each prompt with itself, ``\\uXXXX`` escapes decoded: a test says what the
    model answers, lone surrogates included."""
    with running_emulator(EmulatorConfig(responder="escapes"), subprocess=True) as emu:
        yield emu


def env() -> dict[str, str]:
    return cli_env(OPENAI_API_KEY=KEY)


# -- 5. lone surrogates in answers ------------------------------------------------------------

# (what the model says for the plain output, for the JSON one): the escapes responder decodes
# ``\uXXXX``; ``\u005c`` is a backslash, so ``\u005cud800`` is the six characters ``\ud800``
# in the answer's text (a JSON escape inside the JSON answer).
SAYS = [
    ("hello", '{"a": "fine"}'),
    ("lone \\ud800 high", '{"a": "fine"}'),  # plain text: the provider's body escapes it
    ("ok", '{"a": "\\u005cud800 x"}'),  # JSON answer holding an escaped lone surrogate
    ("pair \\ud83d\\ude00", '{"a": "\\u005cud83d\\u005cude00"}'),  # a valid pair: kept
    ("low \\udc00", '{"a": "y \\u005cudc00"}'),
]
PLAIN = ["hello", f"lone {FFFD} high", "ok", "pair \U0001f600", f"low {FFFD}"]
JSON_A = ["fine", "fine", f"{FFFD} x", "\U0001f600", f"y {FFFD}"]


def surrogate_config(tmp_path: Path, emu: EmulatorHandle, kind: str) -> Path:
    """Two outputs of ``kind`` (``llm`` or ``batch_api``): ``plain`` (text) and ``data``
    (JSON with a field ``a``)."""
    processor: dict[str, Any] = (
        {"type": "llm", "model": MODEL, "base_url": emu.openai_base_url, "max_retries": 0}
        if kind == "llm"
        else {"type": "batch_api", "provider": "openai", "model": MODEL}
    )
    if kind == "llm":
        processor["message_format"] = "openai"
    else:
        processor["base_url"] = emu.openai_base_url
    rows = [{"id": i, "say": say, "js": js} for i, (say, js) in enumerate(SAYS)]
    schema = {"id": "{{ id }}", "plain": "{{ plain }}", "data": "{{ data }}"}
    return write_yaml(
        tmp_path / f"{kind}.yaml",
        {
            "processors": [processor],
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
                "inputs": [{"name": n, "key": n} for n in ("id", "say", "js")],
                "outputs": [
                    {"name": "plain", "type": kind, "prompt": "{{ say }}"},
                    {
                        "name": "data",
                        "type": kind,
                        "prompt": "{{ js }}",
                        "output_type": "JSON",
                        "output_schema": ["a"],
                    },
                ],
                "output_schema": schema,
                "remove_columns": True,
            },
        },
    )


def test_provider_json_mends_only_what_orjson_refuses_for_a_surrogate() -> None:
    import orjson

    from llm_kit.provider_json import loads

    body = b'{"t": "a\\ud800b", "\\udc00k": ["\\ud83d\\ude00", 1]}'
    assert loads(body) == {"t": f"a{FFFD}b", f"{FFFD}k": ["\U0001f600", 1]}
    assert loads(b'{"t": "plain"}') == {"t": "plain"}
    with pytest.raises(orjson.JSONDecodeError):  # any other refusal stays orjson's
        loads(b'{"t": NaN}')


def check_surrogate_rows(rows: list[dict[str, Any]]) -> None:
    assert [r["id"] for r in rows] == list(range(len(SAYS)))
    assert [r["__errors__"] for r in rows] == [None] * len(SAYS), rows
    assert [r["plain"] for r in rows] == PLAIN
    assert [r["data"] for r in rows] == [{"a": a} for a in JSON_A]


def test_live_answers_with_lone_surrogates_are_kept_and_read_back(
    escapes: EmulatorHandle, tmp_path: Path
) -> None:
    config = surrogate_config(tmp_path, escapes, "llm")
    run = mmirage("run", "--config", config, env=env())
    assert run.code == 0, str(run)
    check_surrogate_rows(shard_rows(tmp_path / "out"))
    for path in (tmp_path / "out").glob("shard-*"):
        path.read_bytes().decode("utf-8")  # valid UTF-8 (raises otherwise)

    # Computed again: every answer comes from the answer store, as it was stored.
    asked = escapes.stats()["requests"]
    rerun = mmirage("run", "--config", config, "--recompute", env=env())
    assert rerun.code == 0, str(rerun)
    assert escapes.stats()["requests"] == asked  # nothing bought twice
    check_surrogate_rows(shard_rows(tmp_path / "out"))


def test_batch_answers_with_lone_surrogates_are_kept_and_merged_again(
    escapes: EmulatorHandle, tmp_path: Path
) -> None:
    config = surrogate_config(tmp_path, escapes, "batch_api")
    run = mmirage("run", "--config", config, env=env())
    assert run.code == 0, str(run)
    for attempt in range(2):  # the second merge reads the results store back
        out = tmp_path / f"merged-{attempt}.jsonl"
        merge = mmirage("merge", "--config", config, "--output-path", out, env=env())
        assert merge.code == 0, str(merge)
        out.read_bytes().decode("utf-8")
        check_surrogate_rows(read_jsonl(out))


# -- 6 and 7. image paths the OS refuses; a refused row keeps its inputs ------------------------

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
# (the row's image value, a fragment of its recorded error)
REFUSED_PATHS = [
    ("bad\x00name.png", "NUL"),
    ("x" * 300 + ".png", "too long"),
    ("folder", "directory"),
    ("deep/" * 900 + "a.png", "too long"),  # the whole path over PATH_MAX
]


def image_config(tmp_path: Path, processor: dict[str, Any], kind: str) -> Path:
    images = tmp_path / "images"
    images.mkdir(parents=True)
    (images / "ok.png").write_bytes(PNG)
    (images / "folder").mkdir()
    values = ["ok.png", *(value for value, _ in REFUSED_PATHS)]
    rows = [{"q": f"question {i}", "note": f"note {i}", "img": v} for i, v in enumerate(values)]
    return write_yaml(
        tmp_path / "images.yaml",
        {
            "processors": [processor],
            "loading_params": {
                "state_dir": str(tmp_path / "state"),
                "datasets": [
                    {
                        "path": write_rows(tmp_path / "rows.jsonl", rows),
                        "type": "JSONL",
                        "output_dir": str(tmp_path / "out"),
                        "image_base_path": str(images),
                    }
                ],
                "output_format": "jsonl",
            },
            "processing_params": {
                "inputs": [
                    {"name": "q", "key": "q"},
                    {"name": "img", "key": "img", "type": "image"},
                ],
                "outputs": [{"name": "answer", "type": kind, "prompt": "Describe {{ q }}"}],
                "output_schema": {
                    "question": "{{ q }}",
                    "answer": "{{ answer }}",
                    "both": "{{ q }}: {{ answer }}",
                    "picture": "{{ img }}",
                },
            },
        },
    )


def check_refused_rows(rows: list[dict[str, Any]], merged: bool = False) -> None:
    assert len(rows) == 1 + len(REFUSED_PATHS)
    assert rows[0]["__errors__"] is None, rows[0]
    for i, (row, (value, why)) in enumerate(zip(rows[1:], REFUSED_PATHS, strict=True), start=1):
        error = row["__errors__"]["__row__"]
        assert "image variable 'img'" in error and why in error, error
        assert "\x00" not in error  # named, not written raw
        # Its inputs are kept (as source columns and where the schema reads only them) ...
        assert (row["q"], row["note"], row["img"]) == (f"question {i}", f"note {i}", value)
        assert row["question"] == f"question {i}"
        # ... and only what reads the failed image or the output it blocks is null.
        assert (row["answer"], row["both"], row["picture"]) == (None, None, None), row


def llm_processor(emu: EmulatorHandle) -> dict[str, Any]:
    return {
        "type": "llm",
        "message_format": "openai",
        "base_url": emu.openai_base_url,
        "model": MODEL,
        "max_retries": 0,
    }


def batch_processor(emu: EmulatorHandle) -> dict[str, Any]:
    return {
        "type": "batch_api",
        "provider": "openai",
        "model": MODEL,
        "base_url": emu.openai_base_url,
    }


def test_live_image_paths_the_os_refuses_are_row_errors(
    escapes: EmulatorHandle, tmp_path: Path
) -> None:
    config = image_config(tmp_path, llm_processor(escapes), "llm")
    run = mmirage("run", config, env=env())
    assert run.code == 1 and f"{len(REFUSED_PATHS)} row(s) failed" in run.err, str(run)
    rows = shard_rows(tmp_path / "out")
    check_refused_rows(rows)
    assert rows[0]["answer"] == "Describe question 0"
    merge = mmirage("merge", config, "--format", "jsonl", env=env())
    assert merge.code == 0, str(merge)
    check_refused_rows(read_jsonl(tmp_path / "out" / "merged.jsonl"))


@pytest.mark.parametrize("dry_run", [False, True], ids=["batch", "export_prompts"])
def test_batch_image_paths_the_os_refuses_are_row_errors(
    dry_run: bool, escapes: EmulatorHandle, tmp_path: Path
) -> None:
    config = image_config(tmp_path, batch_processor(escapes), "batch_api")
    export = ["--export-prompts", str(tmp_path / "prompts.jsonl")] if dry_run else []
    run = mmirage("run", config, *export, env=env())
    assert run.code == 1 and f"{len(REFUSED_PATHS)} row(s) failed" in run.err, str(run)
    if dry_run:  # a dry run publishes no shard: the one good row's request is exported
        assert len(read_jsonl(next(tmp_path.glob("prompts.*.jsonl")))) == 1
        return
    merged = tmp_path / "merged.jsonl"
    merge = mmirage("merge", config, "--output-path", merged, env=env())
    assert merge.code == 0, str(merge)
    rows = read_jsonl(merged)
    check_refused_rows(rows)
    assert rows[0]["answer"] == "Describe question 0"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_image_is_a_row_error(tmp_path: Path) -> None:
    from mmirage.core.render.variables import RowError, resolve_image

    locked = tmp_path / "locked.png"
    locked.write_bytes(PNG)
    locked.chmod(0)
    with pytest.raises(RowError, match=r"locked.png.*Permission denied"):
        resolve_image("locked.png", "img", str(tmp_path))


# -- 10. source columns with a reserved name ----------------------------------------------------


def reserved_config(
    tmp_path: Path, emu: EmulatorHandle, rows: list[dict[str, Any]], **params: Any
) -> Path:
    return write_yaml(
        tmp_path / "reserved.yaml",
        {
            "processors": [llm_processor(emu)],
            "loading_params": {
                "state_dir": str(tmp_path / "state"),
                "datasets": [
                    {
                        "path": write_rows(tmp_path / "rows.jsonl", rows),
                        "type": "JSONL",
                        "output_dir": str(tmp_path / "out"),
                    }
                ],
                "output_format": "jsonl",
            },
            "processing_params": {
                "inputs": [{"name": "q", "key": "q"}],
                "outputs": [{"name": "answer", "type": "llm", "prompt": "{{ q }}"}],
                "output_schema": {"answer": "{{ answer }}"},
                **params,
            },
        },
    )


@pytest.mark.parametrize("column", ["__vars__", "__errors__", "__retry__", "__row_key__"])
def test_a_source_column_with_a_reserved_name_is_refused_in_one_sentence(
    column: str, escapes: EmulatorHandle, tmp_path: Path
) -> None:
    rows = [{"q": "a"}, {"q": "b", column: {"kept": "as data"}}, {"q": "c"}]
    config = reserved_config(tmp_path, escapes, rows)
    asked = escapes.stats()["requests"]
    run = mmirage("run", config, env=env())
    assert run.code == 2 and len(run.error_lines) == 1, str(run)  # the data's error: one line
    sentence = (
        f"column '{column}' of {tmp_path / 'rows.jsonl'} (row id 1) has a name mmirage reserves "
        "for its own columns"
    )
    assert sentence in run.err and "remove_columns: true" in run.err, str(run)
    assert escapes.stats()["requests"] == asked  # refused before anything was paid for
    assert shard_rows(tmp_path / "out") == []


def test_a_reserved_source_column_is_fine_when_source_columns_are_not_kept(
    escapes: EmulatorHandle, tmp_path: Path
) -> None:
    rows = [{"q": "a", "__vars__": "read as data"}]
    config = reserved_config(
        tmp_path,
        escapes,
        rows,
        inputs=[{"name": "q", "key": "q"}, {"name": "v", "key": "__vars__"}],
        output_schema={"answer": "{{ answer }}", "v": "{{ v }}"},
        remove_columns=True,
    )
    run = mmirage("run", config, env=env())
    assert run.code == 0, str(run)
    merge = mmirage("merge", config, "--format", "jsonl", env=env())
    assert merge.code == 0, str(merge)
    [row] = read_jsonl(tmp_path / "out" / "merged.jsonl")
    assert (row["answer"], row["v"]) == ("a", "read as data")


def test_an_output_schema_column_with_a_reserved_name_is_refused_at_load(
    escapes: EmulatorHandle, tmp_path: Path
) -> None:
    config = reserved_config(
        tmp_path, escapes, [{"q": "a"}], output_schema={"__usage__": "{{ answer }}"}
    )
    check = mmirage("check", config, env=env())
    assert check.code == 2, str(check)
    assert "processing_params.output_schema.__usage__" in check.err
    assert "reserves" in check.err and check.err.count("\n") == 1, check.err


def test_the_reserved_names_are_the_columns_mmirage_adds() -> None:
    from mmirage import rundir
    from mmirage.config.reserved import RESERVED_COLUMNS

    added = {rundir.ROW_KEY, rundir.ERRORS, rundir.USAGE, rundir.VARS, rundir.RETRY}
    assert (
        added
        == RESERVED_COLUMNS
        == {"__row_key__", "__errors__", "__usage__", "__vars__", "__retry__"}
    )


def test_a_custom_adapters_lone_surrogate_is_stored_and_read_back(tmp_path: Path) -> None:
    from mmirage.core.process.batch.results_store import BatchRecord, ResultsStore

    with ResultsStore(tmp_path / "results.sqlite") as store:
        store.add_batch(BatchRecord("mistral", "b1", submitted_at="2026-01-01"), ["0::0::0"])
        rows = [{"custom_id": "0::0::0", "generated_text": "broken \ud800 half"}]
        # Before: UnicodeEncodeError from sqlite, and every merge died on it.
        store.store_results("mistral", "b1", rows, unanswered=("missing", "no result"))
        outcome = store.lookup(["0::0::0"])["0::0::0"]
    assert outcome.ok and outcome.text == "broken \ufffd half"


def test_llm_kit_names_an_image_path_with_a_nul_byte_as_the_items_error() -> None:
    from llm_kit.errors import ItemError
    from llm_kit.images import resolve_image_url

    with pytest.raises(ItemError, match="NUL byte"):  # before: ValueError, the caller's crash
        resolve_image_url("photos/cat\x00.png")
