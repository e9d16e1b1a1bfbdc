"""The MMIRAGE "Batch API" page, promise by promise, through the real command line.

Every test runs ``mmirage run|check|merge|retry --config ...`` as a subprocess against the
provider emulator in its own process; keys are set in the subprocess environment only. Tests
are named after the sentence of the page (or of issue 5's "better than the original" list)
they hold us to. Expensive setups (the spec's example config, the two-shard grid) run once per
module and several tests read what they left.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import re
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
import yaml

from batch_spec_support import (
    MISTRAL_BASE_URL,
    PLACEHOLDER,
    REPO,
    RUN_ID,
    TESTS,
    Cli,
    Emulators,
    batches_created,
    cli_env,
    incomplete_rows,
    mmirage,
    read_jsonl,
    receipt_files,
    receipt_ids,
    receipt_lines,
    request_totals,
    shard_rows,
    write_rows,
    write_yaml,
)
from mmirage.config import load_mmirage_config_dict
from mmirage.config.processors import BatchApiProcessorConfig
from provider_emulator.runner import EmulatorHandle

KEY = "sk-spec-test-key-31415"
KEY_VAR = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}
EXAMPLE = "configs/batch_config.yaml"
EXAMPLE_ANTHROPIC = "configs/config_mock_anthropic_batch.yaml"
QUESTIONS = read_jsonl(REPO / "examples/batch_api/questions.jsonl")
PROMPT = "Answer the following question concisely:\n{{ question }}\n"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SUMMARY = "------------ Batch status summary ------------"


@pytest.fixture(scope="module")
def emulators() -> Iterator[Emulators]:
    with contextlib.ExitStack() as stack:
        yield Emulators(stack)


# -- helpers ----------------------------------------------------------------------------------


def base_url(emu: EmulatorHandle | None, provider: str) -> str:
    if emu is None:
        return "http://127.0.0.1:9/v1"  # nothing listens: a dry run must not call it
    return emu.openai_base_url if provider == "openai" else emu.url


def key_env(provider: str = "openai", **extra: str) -> dict[str, str]:
    return cli_env(**{KEY_VAR[provider]: KEY}, **extra)


def question_rows(n: int = len(QUESTIONS)) -> list[dict[str, Any]]:
    return [dict(row) for row in QUESTIONS[:n]]


@dataclass(frozen=True)
class Setup:
    """A written config and where its run puts things."""

    config: Path
    root: Path
    provider: str = "openai"

    @property
    def meta(self) -> Path:
        return self.root / "meta" / "batch_metadata.jsonl"

    @property
    def out(self) -> Path:
        return self.root / "out"

    def receipts(self, modality: str = "*") -> list[Path]:
        return receipt_files(self.meta, modality)

    def lines(self) -> list[dict[str, Any]]:
        return receipt_lines(self.receipts())


def prepare(
    root: Path,
    emu: EmulatorHandle | None,
    rows: Sequence[Mapping[str, Any]],
    provider: str = "openai",
    execution: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Setup:
    """One dataset, one plain ``answer`` output, JSONL shards; ``fields`` go to the processor.
    Rows with an ``img`` key send it as an image (a file under ``root``, its image_base_path)."""
    made = Setup(root / "config.yaml", root, provider)
    processor = {
        "type": "batch_api",
        "provider": provider,
        "model": MODEL[provider],
        "base_url": base_url(emu, provider),
        "metadata_output_path": str(made.meta),
        **fields,
    }
    data = {
        "processors": [processor],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [
                {
                    "path": write_rows(root / "data.jsonl", rows),
                    "type": "JSONL",
                    "output_dir": str(made.out),
                    "image_base_path": str(root),  # the tests' images live in root
                }
            ],
            "output_format": "jsonl",
            "batch_size": 4,
        },
        "processing_params": {
            "inputs": [
                {"name": "question", "key": "question"},
                {"name": "image", "key": "img", "type": "image", "optional": True},
            ],
            "outputs": [{"name": "answer", "type": "batch_api", "prompt": PROMPT}],
            "output_schema": {"question": "{{ question }}", "answer": "{{ answer }}"},
        },
        "execution_params": {"poll_interval_seconds": 0.3, **(execution or {})},
    }
    write_yaml(made.config, data)
    return made


def ok(result: Cli, code: int = 0) -> Cli:
    assert result.code == code, str(result)
    assert "Traceback" not in result.err, str(result)
    return result


def check_complete(
    rows: Sequence[Mapping[str, Any]], questions: Sequence[Mapping[str, Any]]
) -> None:
    """Every row merged, in source order, with its own answer and token counts."""
    assert len(rows) == len(questions)
    for row, source in zip(rows, questions, strict=True):
        assert row["__errors__"] is None, row
        assert row["question"] == source["question"]
        assert source["question"][:40] in row["answer"]  # the echo responder quotes the prompt
        assert isinstance(row["input_tokens"], int) and row["input_tokens"] > 0
        assert isinstance(row["output_tokens"], int) and row["output_tokens"] > 0


def placeholders(value: Any) -> Iterator[str]:
    """Every ``__BATCH_SUBMITTED__:<custom_id>`` suffix in a (nested) value."""
    if isinstance(value, str):
        yield from re.findall(r"__BATCH_SUBMITTED__:([A-Za-z0-9_-]+)", value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from placeholders(item)
    elif isinstance(value, list):
        for item in value:
            yield from placeholders(item)


def oai(emu: EmulatorHandle) -> openai.OpenAI:
    return openai.OpenAI(base_url=emu.openai_base_url, api_key=KEY, max_retries=0)


def provider_result_ids(emu: EmulatorHandle, batch_id: str) -> list[str]:
    """The custom_ids of a finished OpenAI batch's result file, read with the official SDK."""
    client = oai(emu)
    batch = client.batches.retrieve(batch_id)
    assert batch.status == "completed" and batch.output_file_id
    content = client.files.content(batch.output_file_id).text
    return [orjson.loads(line)["custom_id"] for line in content.splitlines() if line.strip()]


def uploaded_lines(emu: EmulatorHandle, receipt: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request lines the provider received for a receipt's batch (its input file)."""
    client = oai(emu)
    batch = client.batches.retrieve(receipt["provider_batch_id"])
    content = client.files.content(batch.input_file_id).text
    return [orjson.loads(line) for line in content.splitlines() if line.strip()]


# -- the spec's complete example config, run once against batches that take 4 s -----------------


@dataclass
class ExampleRun:
    emu: EmulatorHandle
    out: Path
    batches_before: int
    batches_after_run: int
    run: Cli
    check_now: Cli
    check_wait: Cli
    receipts: list[Path]
    moved: Path
    check_moved: Cli
    check_explicit: Cli
    merge_explicit: Cli
    merged_explicit: Path
    merge_moved: Cli
    merge_default: Cli
    merged: Path


@pytest.fixture(scope="module")
def example(emulators: Emulators, tmp_path_factory: pytest.TempPathFactory) -> ExampleRun:
    """The page's three steps with its own config file and its own commands:
    run; check (batches still running); check --wait; then, the receipt moved away, check and
    merge given --metadata-path (and without it: read from the chunk's marker, with a
    warning); then merge from the config."""
    emu = emulators["paced"]
    out = tmp_path_factory.mktemp("example")
    env = key_env(OPENAI_BASE_URL=emu.openai_base_url, MMIRAGE_BATCH_OUT=str(out))
    before = batches_created(emu)
    run = mmirage("run", "--config", EXAMPLE, env=env)
    after = batches_created(emu)
    check_now = mmirage("check", "--config", EXAMPLE, env=env)
    check_wait = mmirage("check", "--config", EXAMPLE, "--wait", "--poll-interval", "0.3", env=env)
    receipts = receipt_files(out / "batch_meta.jsonl")
    # The page's own example name for a receipt given by hand.
    moved = out / "elsewhere" / "batch_metadata.text.abc123.jsonl"
    moved.parent.mkdir()
    assert len(receipts) == 1, receipts
    shutil.move(receipts[0], moved)
    check_moved = mmirage("check", "--config", EXAMPLE, env=env)
    check_explicit = mmirage("check", "--config", EXAMPLE, "--metadata-path", moved, env=env)
    merged_explicit = out / "merged_explicit.jsonl"
    merge_explicit = mmirage(
        "merge", "--config", EXAMPLE, "--metadata-path", moved, "--output-path", merged_explicit,
        env=env,
    )  # fmt: skip
    merge_moved = mmirage("merge", "--config", EXAMPLE, "--output-path", out / "x.jsonl", env=env)
    shutil.copy(moved, receipts[0])
    merged = out / "final_merged_output.jsonl"
    merge_default = mmirage("merge", "--config", EXAMPLE, "--output-path", merged, env=env)
    return ExampleRun(
        emu, out, before, after, run, check_now, check_wait, receipts, moved, check_moved,
        check_explicit, merge_explicit, merged_explicit, merge_moved, merge_default, merged,
    )  # fmt: skip


def test_complete_example_config_submits_and_exits_before_the_batches_end(
    example: ExampleRun,
) -> None:
    ok(example.run)
    assert example.batches_after_run - example.batches_before == 1  # 12 rows: one chunk
    # Right after `run` the batch is still running: run did not wait for it.
    ok(example.check_now)
    assert ": in_progress" in example.check_now.out, str(example.check_now)
    assert "  - in_progress: 1/1" in example.check_now.out


def test_shards_hold_placeholders_whose_suffix_is_the_custom_id_in_receipts_and_results(
    example: ExampleRun,
) -> None:
    rows = shard_rows(example.out / "output" / "shards")
    assert [row["question"] for row in rows] == [q["question"] for q in QUESTIONS]
    expected = [f"answer-text-{n}" for n in range(len(QUESTIONS))]
    assert [row["answer"] for row in rows] == [f"{PLACEHOLDER}{cid}" for cid in expected]
    (receipt,) = receipt_lines(example.receipts)
    assert sorted(receipt["custom_id_to_source_index"]) == sorted(expected)
    results = provider_result_ids(example.emu, receipt["provider_batch_id"])
    assert sorted(results) == sorted(expected)


def test_receipts_are_named_metadata_path_modality_run_id_and_map_custom_id_to_source_index(
    example: ExampleRun,
) -> None:
    names = sorted(p.name for p in example.out.glob("batch_meta*.jsonl"))
    assert len(names) == 1, names
    prefix, modality, run_id, suffix = names[0].split(".")
    assert (prefix, modality, suffix) == ("batch_meta", "text", "jsonl")
    assert RUN_ID.match(run_id)
    (receipt,) = receipt_lines(example.receipts)
    assert receipt["provider"] == "openai" and receipt["provider_batch_id"]
    mapping = receipt["custom_id_to_source_index"]
    assert mapping == {f"answer-text-{n}": n for n in range(len(QUESTIONS))}
    # Each custom_id's request carries the question of the source row it maps to.
    uploaded = {line["custom_id"]: line for line in uploaded_lines(example.emu, receipt)}
    for custom_id, index in mapping.items():
        content = uploaded[custom_id]["body"]["messages"][0]["content"]
        assert QUESTIONS[index]["question"] in content


def test_check_reports_the_provider_batch_status_from_receipts_found_by_the_config(
    example: ExampleRun,
) -> None:
    (receipt,) = receipt_lines(example.receipts)
    batch_id = receipt["provider_batch_id"]
    out = ok(example.check_now).out
    assert out.splitlines()[0].startswith(f"Batch {batch_id} (openai): in_progress")
    assert out.rstrip().endswith(f"{SUMMARY}\nProvider 'openai' (Total: 1):\n  - in_progress: 1/1")
    assert "SHARD" not in out  # batch status instead of shard status
    assert f"Batch {batch_id} (openai): completed" in ok(example.check_wait).out


def test_check_wait_polls_until_every_batch_has_ended(example: ExampleRun) -> None:
    assert ": in_progress" in example.check_now.out  # it had something to wait for
    ok(example.check_wait)
    assert "  - completed: 1/1" in example.check_wait.out
    assert "in_progress" not in example.check_wait.out


def test_check_metadata_path_reads_the_receipt_given_by_hand(example: ExampleRun) -> None:
    # With the receipt moved out of the config's reach, the default reads its batch from the
    # chunk's marker and says so (a paid batch is never out of reach) ...
    assert ok(example.check_moved).err.count("receipt file of run") == 1, str(example.check_moved)
    assert "(deleted or moved)" in example.check_moved.err
    # ... and --metadata-path /path/to/batch_metadata.text.abc123.jsonl reads it.
    (receipt,) = read_jsonl(example.moved)
    out = ok(example.check_explicit).out
    assert f"Batch {receipt['provider_batch_id']} (openai): completed" in out


def test_merge_metadata_path_reads_the_receipt_given_by_hand(example: ExampleRun) -> None:
    assert "(deleted or moved)" in ok(example.merge_moved).err  # read from the chunk marker
    ok(example.merge_explicit)
    check_complete(read_jsonl(example.merged_explicit), QUESTIONS)
    assert example.merged_explicit.read_bytes() == example.merged.read_bytes()


def test_merge_output_path_writes_one_ordered_jsonl_with_tokens_and_prints_run_totals(
    example: ExampleRun,
) -> None:
    out = ok(example.merge_default).out
    rows = read_jsonl(example.merged)
    check_complete(rows, QUESTIONS)
    n = len(QUESTIONS)
    assert f"merged {n} rows into {example.merged}" in out
    assert f"rows: {n} ({n} complete, 0 with errors)" in out
    assert request_totals(out) == {
        "total": n, "succeeded": n, "failed": 0, "expired": 0, "canceled": 0, "missing": 0,
        "running": 0,
    }  # fmt: skip
    tin, tout = sum(r["input_tokens"] for r in rows), sum(r["output_tokens"] for r in rows)
    assert f"tokens: {tin:,} input, {tout:,} output" in out
    assert not list(example.out.glob("*.jsonl.tmp*"))


# -- the dry run ----------------------------------------------------------------------------------


@dataclass
class DryRun:
    root: Path
    batches_before: int
    batches_after: int
    file_run: Cli
    dir_runs: list[Cli]
    check: Cli
    check_named: Cli


@pytest.fixture(scope="module")
def dry_run(emulators: Emulators, tmp_path_factory: pytest.TempPathFactory) -> DryRun:
    """The example config exported without any key: once to a .jsonl path, twice to a
    directory; then check, by default and given a dry-run receipt."""
    emu = emulators["clean"]
    root = tmp_path_factory.mktemp("dry")
    env = cli_env(OPENAI_BASE_URL=emu.openai_base_url, MMIRAGE_BATCH_OUT=str(root / "out"))
    before = batches_created(emu)
    file_run = mmirage(
        "run", "--config", EXAMPLE, "--export-prompts", root / "x/prompts.jsonl", env=env
    )
    dir_runs = [
        mmirage("run", "--config", EXAMPLE, "--export-prompts", root / "exports", env=env)
        for _ in range(2)
    ]
    after = batches_created(emu)
    check = mmirage("check", "--config", EXAMPLE, env=env)
    named = sorted((root / "out").glob("batch_meta.dry-run.*.jsonl"))[:1]
    check_named = mmirage("check", "--config", EXAMPLE, "--metadata-path", *named, env=env)
    return DryRun(root, before, after, file_run, dir_runs, check, check_named)


def exported(path: Path) -> list[dict[str, Any]]:
    return read_jsonl(path)


def test_export_prompts_needs_no_key_and_writes_prompts_run_id_jsonl(dry_run: DryRun) -> None:
    ok(dry_run.file_run)
    assert dry_run.batches_after == dry_run.batches_before  # nothing was submitted
    files = sorted((dry_run.root / "x").iterdir())
    assert len(files) == 1
    name = files[0].name
    assert name.startswith("prompts.") and name.endswith(".jsonl")
    assert RUN_ID.match(name.split(".")[1]), name
    lines = exported(files[0])
    assert len(lines) == len(QUESTIONS)
    assert all(set(line) == {"batch_id", "request"} for line in lines)
    assert [line["request"]["custom_id"] for line in lines] == [
        f"answer-text-{n}" for n in range(len(QUESTIONS))
    ]
    # No shard output: a real run afterwards submits everything.
    assert not list((dry_run.root / "out" / "output" / "shards").glob("shard-*"))


def test_exported_request_is_submittable_as_is_with_the_openai_sdk(
    dry_run: DryRun, emulators: Emulators
) -> None:
    (path,) = (dry_run.root / "x").iterdir()
    line = exported(path)[3]
    client = oai(emulators["clean"])
    upload = client.files.create(
        file=("one.jsonl", orjson.dumps(line["request"]) + b"\n"), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=upload.id, endpoint=line["request"]["url"], completion_window="24h"
    )
    deadline = time.monotonic() + 20
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id
    (result,) = [
        orjson.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()
    ]
    assert result["custom_id"] == "answer-text-3"
    assert result["response"]["status_code"] == 200
    answer = result["response"]["body"]["choices"][0]["message"]["content"]
    assert QUESTIONS[3]["question"] in answer


def test_export_path_without_jsonl_is_a_directory_and_two_runs_never_share_a_file(
    dry_run: DryRun,
) -> None:
    for run in dry_run.dir_runs:
        ok(run)
    files = sorted((dry_run.root / "exports").iterdir())
    assert len(files) == 2, files
    for path in files:
        assert re.fullmatch(r"exported_prompts\.[0-9a-f]{6}\.jsonl", path.name), path.name
        assert len(exported(path)) == len(QUESTIONS)


def test_dry_run_receipts_are_named_dry_run_and_check_skips_them(dry_run: DryRun) -> None:
    out = dry_run.root / "out"
    export_ids = {p.name.split(".")[1] for p in (dry_run.root / "x").iterdir()}
    export_ids |= {p.name.split(".")[1] for p in (dry_run.root / "exports").iterdir()}
    dry = sorted(out.glob("batch_meta.dry-run.text.*.jsonl"))
    assert {p.name.split(".")[3] for p in dry} == export_ids  # one per run, with its run id
    assert not receipt_files(out / "batch_meta.jsonl")  # no real receipt
    assert dry_run.check.code == 2, str(dry_run.check)
    assert dry_run.check.error_lines[0].startswith("error: no batch receipts found")
    named = ok(dry_run.check_named, 1)  # skipped even when named: no receipt to check
    assert named.error_lines == [
        f"error: no batch receipt found in {dry_run.check_named.argv[-1]} (dry-run receipts are "
        "skipped); name the <metadata_output_path>.<modality>.<run_id>.jsonl files that "
        "'mmirage run' wrote"
    ]
    assert SUMMARY not in named.out


def test_dry_run_refuses_mode_slurm(tmp_path: Path) -> None:
    made = prepare(tmp_path, None, question_rows(3), execution={"mode": "slurm", "account": "acct"})
    result = ok(
        mmirage(
            "run", "--config", made.config, "--export-prompts", tmp_path / "p.jsonl", env=cli_env()
        ),
        2,
    )
    assert len(result.error_lines) == 1 and "mode: local" in result.error_lines[0]
    assert not list(tmp_path.glob("p*.jsonl"))


# -- keys and config validation ---------------------------------------------------------------


def test_missing_key_fails_before_any_row_is_processed(
    emulators: Emulators, tmp_path: Path
) -> None:
    emu = emulators["clean"]
    made = prepare(tmp_path, emu, question_rows())
    before = batches_created(emu)
    result = ok(mmirage("run", "--config", made.config, env=cli_env()), 2)
    assert result.error_lines == [line for line in result.err.splitlines() if line.strip()]
    assert len(result.error_lines) == 1 and "OPENAI_API_KEY" in result.error_lines[0]
    assert batches_created(emu) == before
    assert not list(made.out.glob("shard-*"))  # no shard output ...
    assert not [p for p in made.out.rglob("*") if p.is_file()]  # ... nor any part file
    assert not made.receipts()


def test_keys_cannot_be_supplied_in_the_yaml(tmp_path: Path) -> None:
    made = prepare(tmp_path, None, question_rows(3), api_key="sk-yaml-secret-27182")
    result = ok(mmirage("run", "--config", made.config, env=cli_env()), 2)
    assert len(result.error_lines) == 1 and "api_key" in result.error_lines[0]
    assert "sk-yaml-secret-27182" not in result.out + result.err
    assert not made.out.exists() or not list(made.out.rglob("shard-*"))


def test_anthropic_temperature_and_top_p_together_are_rejected_at_load(tmp_path: Path) -> None:
    made = prepare(tmp_path, None, question_rows(3), "anthropic", temperature=0.2, top_p=0.9)
    for command in ("run", "check"):
        result = ok(mmirage(command, "--config", made.config, env=key_env("anthropic")), 2)
        assert len(result.error_lines) == 1
        assert "temperature" in result.error_lines[0] and "top_p" in result.error_lines[0]
    only_one = prepare(tmp_path / "one", None, question_rows(3), "anthropic", top_p=0.9)
    processor = load_mmirage_config_dict(read_yaml(only_one.config), env={}).processors[0]
    assert isinstance(processor, BatchApiProcessorConfig)
    assert getattr(processor.provider_config, "top_p", None) == 0.9  # one alone is fine


def read_yaml(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def test_anthropic_without_temperature_or_top_p_leaves_sampling_to_the_provider(
    tmp_path: Path,
) -> None:
    made = prepare(tmp_path, None, question_rows(1), "anthropic")
    ok(
        mmirage(
            "run", "--config", made.config, "--export-prompts", tmp_path / "p.jsonl", env=cli_env()
        )
    )
    ((line,),) = [read_jsonl(p) for p in tmp_path.glob("p.*.jsonl")]
    params = line["request"]["params"]
    assert line["request"]["custom_id"] == "answer-text-0"
    assert params["model"] == "claude-haiku-4-5" and params["max_tokens"] == 8192
    assert "temperature" not in params and "top_p" not in params


def test_the_run_id_is_an_argument_not_an_environment_variable(tmp_path: Path) -> None:
    # A parent run hands its id to its shard processes as --run-id; MMIRAGE_RUN_ID is not read.
    made = prepare(tmp_path, None, question_rows(1))
    export = tmp_path / "p.jsonl"
    env = cli_env(MMIRAGE_RUN_ID="fromenv")
    ok(
        mmirage(
            "run", "--config", made.config, "--export-prompts", export, "--run-id", "r42", env=env
        )
    )
    assert [p.name for p in tmp_path.glob("p.*.jsonl")] == ["p.r42.jsonl"]
    ok(mmirage("run", "--config", made.config, "--export-prompts", export, env=env))
    drawn = {p.name for p in tmp_path.glob("p.*.jsonl")} - {"p.r42.jsonl"}
    assert len(drawn) == 1 and "fromenv" not in drawn.pop()


def test_provider_determines_which_fields_are_accepted(tmp_path: Path) -> None:
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("anthropic", {"completion_window": "24h"}, "completion_window"),  # an openai field
        ("openai", {"timeout_seconds": 5}, "timeout_seconds"),  # an anthropic field
        ("openai", {"completion_window": "48h"}, "24h"),  # only 24h is supported
        ("openai", {"oversized_request_policy": "split"}, "oversized_request_policy"),
    ]
    for i, (provider, fields, named) in enumerate(cases):
        made = prepare(tmp_path / str(i), None, question_rows(2), provider, **fields)
        result = ok(mmirage("check", "--config", made.config, env=key_env(provider)), 2)
        assert len(result.error_lines) == 1 and named in result.error_lines[0], str(result)


def provider_config(provider: str) -> Any:
    data = {
        "processors": [{"type": "batch_api", "provider": provider}],
        "loading_params": {"datasets": [{"path": "x.jsonl", "type": "JSONL", "output_dir": "o"}]},
        "processing_params": {
            "inputs": [{"name": "q", "key": "q"}],
            "outputs": [{"name": "a", "type": "batch_api", "prompt": "{{ q }}"}],
            "output_schema": {"a": "{{ a }}"},
        },
    }
    processor = load_mmirage_config_dict(data, env={}).processors[0]
    assert isinstance(processor, BatchApiProcessorConfig)
    return processor.provider_config


def test_field_defaults_are_the_pages() -> None:
    openai_config = provider_config("openai")
    shared = (
        "max_chunk_bytes",
        "max_requests_per_chunk",
        "metadata_output_path",
        "oversized_request_policy",
    )
    for pc in (openai_config, provider_config("anthropic")):
        assert [getattr(pc, name) for name in shared] == [52428800, None, "", "isolate"]
    assert (openai_config.model, openai_config.batch_endpoint, openai_config.completion_window) == (
        "gpt-4.1-mini", "/v1/chat/completions", "24h",
    )  # fmt: skip
    assert (openai_config.base_url, openai_config.metadata) == (None, {})
    anthropic_config = provider_config("anthropic")
    assert (anthropic_config.model, anthropic_config.max_tokens) == ("claude-haiku-4-5", 8192)
    assert (anthropic_config.temperature, anthropic_config.top_p) == (None, None)
    assert (anthropic_config.base_url, anthropic_config.timeout_seconds) == (None, None)


# -- request chunking -----------------------------------------------------------------------------


def by_chunk(lines: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(lines, key=lambda line: str(line["chunk_id"]))


def spooled_sizes(receipt: Mapping[str, Any]) -> list[int]:
    """The byte size (newline counted: max_chunk_bytes is the file's size) of each request line
    of a receipt's chunk."""
    return [len(line) for line in Path(receipt["spool_path"]).read_bytes().splitlines(True)]


def test_chunks_respect_max_requests_per_chunk(emulators: Emulators, tmp_path: Path) -> None:
    emu = emulators["clean"]
    made = prepare(tmp_path, emu, question_rows(), max_requests_per_chunk=5)
    before = batches_created(emu)
    ok(mmirage("run", "--config", made.config, env=key_env()))
    lines = by_chunk(made.lines())
    assert [line["submitted_request_count"] for line in lines] == [5, 5, 2]
    assert batches_created(emu) - before == 3
    assert sorted(receipt_ids(lines)) == sorted(f"answer-text-{n}" for n in range(12))


def test_openai_metadata_is_sent_on_batch_creation(emulators: Emulators, tmp_path: Path) -> None:
    emu = emulators["clean"]
    made = prepare(tmp_path, emu, question_rows(3), metadata={"project": "spec-walk"})
    ok(mmirage("run", "--config", made.config, env=key_env()))
    (receipt,) = made.lines()
    batch = oai(emu).batches.retrieve(receipt["provider_batch_id"])
    assert batch.metadata is not None and batch.metadata.get("project") == "spec-walk"


def test_chunks_respect_max_chunk_bytes(emulators: Emulators, tmp_path: Path) -> None:
    emu = emulators["clean"]
    limit = 700  # two or three of these requests
    made = prepare(tmp_path, emu, question_rows(), max_chunk_bytes=limit)
    ok(mmirage("run", "--config", made.config, env=key_env()))
    lines = by_chunk(made.lines())
    assert len(lines) >= 4
    assert sum(line["submitted_request_count"] for line in lines) == 12
    sizes = [spooled_sizes(line) for line in lines]
    for line, chunk in zip(lines, sizes, strict=True):
        assert sum(chunk) == line["total_bytes"] <= limit
        assert line["has_oversized_request"] is False
    for chunk, following in itertools.pairwise(sizes):
        assert sum(chunk) + following[0] > limit  # a chunk closes only when it must


def oversized_rows() -> list[dict[str, Any]]:
    rows = question_rows(6)
    rows[3]["question"] = "Summarize: " + "lorem ipsum " * 250  # about 3 kB alone
    return rows


def test_oversized_request_isolate_gets_a_dedicated_chunk(
    emulators: Emulators, tmp_path: Path
) -> None:
    emu = emulators["clean"]
    made = prepare(
        tmp_path, emu, oversized_rows(), max_chunk_bytes=1500, oversized_request_policy="isolate"
    )
    ok(mmirage("run", "--config", made.config, env=key_env()))
    lines = made.lines()
    isolated = [line for line in lines if line["has_oversized_request"]]
    assert len(isolated) == 1
    assert isolated[0]["custom_id_to_source_index"] == {"answer-text-3": 3}
    assert isolated[0]["submitted_request_count"] == 1 and isolated[0]["total_bytes"] > 1500
    others = [line for line in lines if not line["has_oversized_request"]]
    assert sorted(receipt_ids(others)) == sorted(f"answer-text-{n}" for n in (0, 1, 2, 4, 5))
    assert all(line["total_bytes"] <= 1500 for line in others)
    merged = tmp_path / "merged.jsonl"
    ok(mmirage("merge", "--config", made.config, "--output-path", merged, env=key_env()))
    check_complete(read_jsonl(merged), oversized_rows())


def test_oversized_request_reject_fails_fast_with_one_sentence(
    emulators: Emulators, tmp_path: Path
) -> None:
    emu = emulators["clean"]
    made = prepare(
        tmp_path, emu, oversized_rows(), max_chunk_bytes=1500, oversized_request_policy="reject"
    )
    result = ok(mmirage("run", "--config", made.config, env=key_env()), 2)
    assert len(result.error_lines) == 1, str(result)
    sentence = result.error_lines[0]
    assert "answer-text-3" in sentence and "max_chunk_bytes" in sentence and "1500" in sentence
    assert "answer-text-3" not in receipt_ids(made.lines())  # nothing of it was submitted
    assert not list(made.out.glob("shard-*"))  # the shard was not published


# -- images ---------------------------------------------------------------------------------------


def test_local_image_is_base64_encoded_and_counts_toward_max_chunk_bytes(
    emulators: Emulators, tmp_path: Path
) -> None:
    emu = emulators["clean"]
    image = tmp_path / "photo.png"
    image.write_bytes(PNG_MAGIC + bytes(range(256)) * 12)  # ~3 kB, ~4 kB in base64
    encoded = base64.b64encode(image.read_bytes()).decode()
    rows = question_rows(6)
    for row in rows[:4]:
        row["img"] = str(image)
    # Text requests are ~250 bytes and share a chunk; each image request alone is ~4.3 kB,
    # so two of them exceed 6000 bytes: one per chunk (they would share one if only the path
    # were counted).
    made = prepare(tmp_path, emu, rows, max_chunk_bytes=6000)
    ok(mmirage("run", "--config", made.config, env=key_env()))
    images = receipt_lines(made.receipts("multimodal"))
    assert [line["submitted_request_count"] for line in images] == [1, 1, 1, 1]
    assert all(len(encoded) < line["total_bytes"] <= 6000 for line in images)
    assert not any(line["has_oversized_request"] for line in images)
    assert sorted(receipt_ids(images)) == [f"answer-multimodal-{n}" for n in range(4)]
    (text,) = receipt_lines(made.receipts("text"))
    assert sorted(text["custom_id_to_source_index"]) == ["answer-text-4", "answer-text-5"]
    for line in images:
        (request,) = uploaded_lines(emu, line)
        parts = request["body"]["messages"][0]["content"]
        urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
        assert urls == [f"data:image/png;base64,{encoded}"]


def test_http_image_url_is_sent_as_is(tmp_path: Path) -> None:
    url = "https://example.com/images/cat.png?size=large"
    rows = question_rows(2)
    rows[0]["img"] = url
    made = prepare(tmp_path, None, rows)
    ok(
        mmirage(
            "run", "--config", made.config, "--export-prompts", tmp_path / "p.jsonl", env=cli_env()
        )
    )
    (path,) = tmp_path.glob("p.*.jsonl")
    requests = {line["request"]["custom_id"]: line["request"] for line in read_jsonl(path)}
    parts = requests["answer-multimodal-0"]["body"]["messages"][0]["content"]
    assert [p["image_url"]["url"] for p in parts if p["type"] == "image_url"] == [url]
    assert requests["answer-text-1"]["body"]["messages"][0]["content"].startswith("Answer")


def test_openai_sends_any_image_type_as_is(tmp_path: Path) -> None:
    bmp = tmp_path / "scan.bmp"
    bmp.write_bytes(b"BM" + b"\0" * 64)
    rows = question_rows(1)
    rows[0]["img"] = str(bmp)
    made = prepare(tmp_path, None, rows)
    export = tmp_path / "p.jsonl"
    ok(mmirage("run", "--config", made.config, "--export-prompts", export, env=cli_env()))
    ((line,),) = [read_jsonl(p) for p in tmp_path.glob("p.*.jsonl")]
    parts = line["request"]["body"]["messages"][0]["content"]
    urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert urls == [f"data:image/bmp;base64,{base64.b64encode(bmp.read_bytes()).decode()}"]


def test_anthropic_rejects_a_bmp_image_before_submission(
    emulators: Emulators, tmp_path: Path
) -> None:
    emu = emulators["clean"]
    png, bmp = tmp_path / "ok.png", tmp_path / "scan.bmp"
    png.write_bytes(PNG_MAGIC + b"\0" * 64)
    bmp.write_bytes(b"BM" + b"\0" * 64)
    rows = question_rows(3)
    rows[0]["img"], rows[1]["img"] = str(png), str(bmp)
    made = prepare(tmp_path, emu, rows, "anthropic")
    before = batches_created(emu, "anthropic")
    # The page: "raises before submission on anything else, so give your images a correct
    # extension": the run stops (exit 2) naming the row and the file; nothing is submitted.
    result = mmirage("run", "--config", made.config, env=key_env("anthropic"))
    assert result.code == 2, str(result)
    (error,) = result.error_lines
    assert error.startswith(f"error: row 0::1: an image of '{bmp}' is image/bmp"), error
    assert "give the file its correct extension" in error and "Traceback" not in result.err
    assert batches_created(emu, "anthropic") == before and not made.lines()

    bmp.rename(converted := tmp_path / "scan.png")  # a PNG now, as far as anyone can tell
    converted.write_bytes(PNG_MAGIC + b"\0" * 64)
    rows[1]["img"] = str(converted)
    made = prepare(tmp_path, emu, rows, "anthropic")
    ok(mmirage("run", "--config", made.config, env=key_env("anthropic")))
    assert sorted(receipt_ids(made.lines())) == [
        "answer-multimodal-0",
        "answer-multimodal-1",
        "answer-text-2",
    ]


def test_an_image_is_typed_by_its_extension(emulators: Emulators, tmp_path: Path) -> None:
    """The page: the type is the extension's (the bytes must still be an image's): a PNG
    named .bmp goes to OpenAI as image/bmp, as it is, with one warning; an SVG goes as-is;
    a text file named .png is no image and stays that row's error."""
    png_as_bmp, svg, text = tmp_path / "photo.bmp", tmp_path / "logo.svg", tmp_path / "notes.png"
    png_as_bmp.write_bytes(PNG_MAGIC + b"\0" * 64)
    svg.write_text('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"/>')
    text.write_text("not an image at all")
    rows = question_rows(3)
    rows[0]["img"], rows[1]["img"], rows[2]["img"] = str(png_as_bmp), str(svg), str(text)
    made = prepare(tmp_path, None, rows)
    export = tmp_path / "p.jsonl"
    exported = ok(
        mmirage("run", "--config", made.config, "--export-prompts", export, env=cli_env()), 1
    )
    assert exported.err.count("holds image/png data but its extension says image/bmp") == 1
    lines = [line for path in sorted(tmp_path.glob("p.*.jsonl")) for line in read_jsonl(path)]
    types = {
        line["request"]["custom_id"]: part["image_url"]["url"].split(";", 1)[0]
        for line in lines
        for part in line["request"]["body"]["messages"][0]["content"]
        if part["type"] == "image_url"
    }
    assert types == {
        "answer-multimodal-0": "data:image/bmp",
        "answer-multimodal-1": "data:image/svg+xml",
    }
    assert "notes.png' is not an image file" in exported.err  # row 2's own error


# -- custom providers -----------------------------------------------------------------------------


def mistral_setup(tmp_path: Path, emu: EmulatorHandle) -> tuple[Setup, dict[str, str]]:
    made = prepare(tmp_path, emu, question_rows(), "openai")
    data = read_yaml(made.config)
    data["processors"] = [
        {"type": "batch_api", "provider": "mistral", "model": "mistral-small-latest",
         "metadata_output_path": str(made.meta)}
    ]  # fmt: skip
    write_yaml(made.config, data)
    plugin = tmp_path / "plugins" / "acme_mistral_batch.py"
    plugin.parent.mkdir()
    plugin.write_text("from batch_spec_support import register_mistral\n\nregister_mistral()\n")
    env = cli_env(MISTRAL_API_KEY=KEY, PYTHONPATH=f"{plugin.parent}:{TESTS}")
    env[MISTRAL_BASE_URL] = emu.openai_base_url
    return made, env


def test_custom_provider_registered_by_MMIRAGE_BATCH_PROVIDERS_runs_with_the_plain_cli(
    emulators: Emulators, tmp_path: Path
) -> None:
    emu = emulators["clean"]
    made, env = mistral_setup(tmp_path, emu)
    refused = mmirage("run", "--config", made.config, env=env)  # without the plugin variable
    assert refused.code == 2 and "mistral" in refused.err, str(refused)
    env["MMIRAGE_BATCH_PROVIDERS"] = "acme_mistral_batch"
    before = batches_created(emu)
    ok(mmirage("run", "--config", made.config, env=env))
    assert batches_created(emu) - before == 1  # the adapter talks to the OpenAI endpoints
    (receipt,) = made.lines()
    assert receipt["provider"] == "mistral"
    assert sorted(receipt["custom_id_to_source_index"]) == sorted(
        f"answer-text-{n}" for n in range(12)
    )
    checked = ok(mmirage("check", "--config", made.config, env=env))
    assert f"Batch {receipt['provider_batch_id']} (mistral): completed" in checked.out
    merged = tmp_path / "merged.jsonl"
    ok(mmirage("merge", "--config", made.config, "--output-path", merged, env=env))
    check_complete(read_jsonl(merged), QUESTIONS)


# -- better than the original: two shards × two datasets × two outputs, text and multimodal -------


GRID = {"a": 5, "b": 4}


def grid_rows(name: str, count: int, image: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(count):
        row: dict[str, Any] = {"question": f"question {name} {i}"}
        if i % 2 == 0:
            row["img"] = str(image)
        rows.append(row)
    return rows


def grid_expected_ids() -> dict[str, int]:
    """custom_id → global source_index: datasets in config order, rows in file order."""
    ids: dict[str, int] = {}
    n = 0
    for count in GRID.values():
        for i in range(count):
            modality = "multimodal" if i % 2 == 0 else "text"
            for output in ("answer", "facts"):
                ids[f"{output}-{modality}-{n}"] = n
            n += 1
    return ids


@dataclass
class GridRun:
    emu: EmulatorHandle
    root: Path
    config: Path
    meta: Path
    env: dict[str, str]
    run: Cli
    merge: Cli
    merged: Path


@pytest.fixture(scope="module")
def grid(emulators: Emulators, tmp_path_factory: pytest.TempPathFactory) -> GridRun:
    emu = emulators["clean"]
    root = tmp_path_factory.mktemp("grid")
    image = root / "pixel.png"
    image.write_bytes(PNG_MAGIC + b"\0" * 32)
    meta = root / "meta" / "batch_metadata.jsonl"
    data = {
        "processors": [
            {"type": "batch_api", "provider": "openai", "model": "gpt-4o-mini",
             "base_url": emu.openai_base_url, "metadata_output_path": str(meta),
             "max_requests_per_chunk": 3}
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [
                {"path": write_rows(root / f"{name}.jsonl", grid_rows(name, count, image)),
                 "type": "JSONL", "output_dir": str(root / f"out-{name}"),
                 "image_base_path": str(root)}
                for name, count in GRID.items()
            ],
            "num_shards": 2,
            "batch_size": 2,
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [
                {"name": "question", "key": "question"},
                {"name": "image", "key": "img", "type": "image", "optional": True},
            ],
            "outputs": [
                {"name": "answer", "type": "batch_api", "prompt": "Answer: {{ question }}"},
                {"name": "facts", "type": "batch_api", "prompt": "Facts: {{ question }}",
                 "output_type": "JSON", "output_schema": {"label": "str", "score": "int"}},
            ],
            "output_schema": {
                "question": "{{ question }}",
                "answer": "{{ answer }}",
                "label": "{{ facts.label }}",
                "facts": "{{ facts }}",
            },
        },
        "execution_params": {"local_parallel_shards": 2, "poll_interval_seconds": 0.3},
    }  # fmt: skip
    config = write_yaml(root / "grid.yaml", data)
    env = key_env()
    run = mmirage("run", "--config", config, env=env)
    merged = root / "merged.jsonl"
    merge = mmirage("merge", "--config", config, "--output-path", merged, env=env)
    return GridRun(emu, root, config, meta, env, run, merge, merged)


def test_two_shards_two_datasets_two_outputs_have_unique_ids_and_receipts(grid: GridRun) -> None:
    ok(grid.run)
    expected = grid_expected_ids()
    text, multimodal = receipt_files(grid.meta, "text"), receipt_files(grid.meta, "multimodal")
    assert len(text) == len(multimodal) == 1  # one file per modality for the whole run
    assert text[0].name.split(".")[2] == multimodal[0].name.split(".")[2]  # one run id
    lines = receipt_lines([*text, *multimodal])
    ids = receipt_ids(lines)
    assert len(ids) == len(set(ids)) == len(expected)  # unique across shards, datasets, outputs
    merged_map = {cid: n for line in lines for cid, n in line["custom_id_to_source_index"].items()}
    assert merged_map == expected
    assert {line["shard_id"] for line in lines} == {0, 1}
    assert {d for line in lines for d in line["datasets"]} == {0, 1}
    assert all(line["submitted_request_count"] <= 3 for line in lines)
    published = [
        cid
        for name in GRID
        for row in shard_rows(grid.root / f"out-{name}")
        for cid in set(placeholders({k: v for k, v in row.items() if k != "__vars__"}))
    ]
    assert sorted(published) == sorted(expected)


def test_two_shards_two_datasets_two_outputs_merge_complete_and_in_source_order(
    grid: GridRun,
) -> None:
    out = ok(grid.merge).out
    rows = read_jsonl(grid.merged)
    questions = [f"question {name} {i}" for name, count in GRID.items() for i in range(count)]
    assert [row["question"] for row in rows] == questions
    for row in rows:
        assert row["__errors__"] is None, row
        assert row["answer"] == f"echo: Answer: {row['question']}"
        assert isinstance(row["facts"], dict) and isinstance(row["facts"]["score"], int)
        assert row["label"] == row["facts"]["label"]
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0
    n = len(grid_expected_ids())
    assert request_totals(out)["succeeded"] == n and request_totals(out)["total"] == n


def test_rerun_after_success_creates_no_new_batches(grid: GridRun) -> None:
    ok(grid.run)
    receipts = {p: p.read_bytes() for p in receipt_files(grid.meta)}
    before = batches_created(grid.emu)
    rerun = ok(mmirage("run", "--config", grid.config, env=grid.env))
    assert batches_created(grid.emu) == before
    assert {p: p.read_bytes() for p in receipt_files(grid.meta)} == receipts
    assert "already done, skipped" in rerun.err


# -- better than the original: faults are reported, retry redoes exactly them --------------------


def incomplete_ids(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    return {f"answer-text-{i}" for i in incomplete_rows(rows)}


def test_check_exits_1_only_when_a_batch_failed_at_the_provider(
    emulators: Emulators, tmp_path: Path, example: ExampleRun
) -> None:
    # Batches still running: 0 (the example's check right after run).
    assert example.check_now.code == 0 and ": in_progress" in example.check_now.out
    # Completed batches with errored requests: 0.
    errors = prepare(
        tmp_path / "errors", emulators["item_errors"], question_rows(), max_requests_per_chunk=6
    )
    ok(mmirage("run", "--config", errors.config, env=key_env()))
    checked = ok(mmirage("check", "--config", errors.config, env=key_env()))
    assert "  - completed: 2/2" in checked.out and " errored" in checked.out, str(checked)
    # A batch that failed at the provider: 1.
    failing = prepare(
        tmp_path / "failing", emulators["failing"], question_rows(), max_requests_per_chunk=6
    )
    ok(mmirage("run", "--config", failing.config, env=key_env()))
    checked = mmirage("check", "--config", failing.config, env=key_env())
    assert checked.code == 1, str(checked)
    for line in failing.lines():
        assert f"Batch {line['provider_batch_id']} (openai): failed" in checked.out
    assert "  - failed: 2/2" in checked.out


def test_item_errors_failed_and_expired_batches_are_reported_and_retry_redoes_exactly_them(
    emulators: Emulators, tmp_path: Path
) -> None:
    emu = emulators["faulty"]
    made = prepare(tmp_path, emu, question_rows(), max_requests_per_chunk=3)
    env = key_env()
    ok(mmirage("run", "--config", made.config, env=env))
    checked = mmirage("check", "--config", made.config, env=env)
    assert checked.code == 1, str(checked)  # a batch failed
    assert "provider status expired" in checked.out, str(checked)
    merged = tmp_path / "merged.jsonl"
    first = ok(mmirage("merge", "--config", made.config, "--output-path", merged, env=env), 1)
    assert "'mmirage retry --config" in first.error_lines[-1]  # exit 1: rows lack results
    totals = request_totals(first.out)
    assert totals["failed"] > 0 and totals["expired"] > 0, first.out
    rows = read_jsonl(merged)
    assert len(rows) == len(QUESTIONS)  # rows without a result are kept, with their error
    todo = incomplete_ids(rows)
    assert len(todo) == totals["failed"] + totals["expired"] == len(QUESTIONS) - totals["succeeded"]
    reasons = " ".join(str(rows[i]["__errors__"]) for i in incomplete_rows(rows))
    assert "expired" in reasons and "failed" in reasons
    for _ in range(8):
        if not todo:
            break
        known = set(receipt_files(made.meta))
        retried = ok(mmirage("retry", "--config", made.config, env=env))
        assert f"resubmitted {len(todo)} request(s)" in retried.out, str(retried)
        new = [p for p in receipt_files(made.meta) if p not in known]
        new_lines = receipt_lines(new)
        assert sorted(receipt_ids(new_lines)) == sorted(todo)  # exactly the unfinished ones
        assert all(line["retry_of"] for line in new_lines)
        again = mmirage("merge", "--config", made.config, "--output-path", merged, env=env)
        rows = read_jsonl(merged)
        left = incomplete_ids(rows)
        ok(again, 1 if left else 0)
        assert left <= todo  # a success is never lost to a later failure
        assert request_totals(again.out)["succeeded"] == len(QUESTIONS) - len(left)
        todo = left
    assert not todo, "retry did not complete every request in 8 rounds"
    check_complete(rows, QUESTIONS)
    before = batches_created(emu)
    done = ok(mmirage("retry", "--config", made.config, env=env))
    assert "nothing to resubmit" in done.out and batches_created(emu) == before


def test_run_wait_output_path_submits_waits_and_merges(
    emulators: Emulators, tmp_path: Path
) -> None:
    made = prepare(tmp_path, emulators["slow"], question_rows())
    merged = tmp_path / "merged.jsonl"
    started = time.monotonic()
    result = ok(
        mmirage("run", "--config", made.config, "--wait", "--output-path", merged, env=key_env())
    )
    assert time.monotonic() - started >= 3.9  # the batch took 4 s: it was waited for
    assert request_totals(result.out)["running"] == 0 and "batches still running" not in result.out
    check_complete(read_jsonl(merged), QUESTIONS)


# -- the other built-in providers, end to end ------------------------------------------------------


def test_anthropic_example_config_end_to_end(emulators: Emulators, tmp_path: Path) -> None:
    emu = emulators["clean"]
    env = key_env(
        "anthropic", ANTHROPIC_BASE_URL=emu.anthropic_base_url, MMIRAGE_BATCH_OUT=str(tmp_path)
    )
    before = batches_created(emu, "anthropic")
    ok(mmirage("run", "--config", EXAMPLE_ANTHROPIC, env=env))
    assert batches_created(emu, "anthropic") - before == 1
    (receipt,) = receipt_lines(receipt_files(tmp_path / "batch_meta.jsonl", "text"))
    assert receipt["provider"] == "anthropic"
    checked = ok(
        mmirage("check", "--config", EXAMPLE_ANTHROPIC, "--wait", "--poll-interval", "0.3", env=env)
    )
    assert f"Batch {receipt['provider_batch_id']} (anthropic): completed" in checked.out
    merged = tmp_path / "merged.jsonl"
    ok(mmirage("merge", "--config", EXAMPLE_ANTHROPIC, "--output-path", merged, env=env))
    check_complete(read_jsonl(merged), QUESTIONS)


def test_gemini_end_to_end(emulators: Emulators, tmp_path: Path) -> None:
    emu = emulators["clean"]
    made = prepare(tmp_path, emu, question_rows(), "gemini")
    env = key_env("gemini")
    before = batches_created(emu, "gemini")
    ok(mmirage("run", "--config", made.config, env=env))
    assert batches_created(emu, "gemini") - before == 1
    (receipt,) = made.lines()
    assert receipt["provider"] == "gemini"
    checked = ok(mmirage("check", "--config", made.config, "--wait", env=env))
    assert f"Batch {receipt['provider_batch_id']} (gemini): completed" in checked.out
    merged = tmp_path / "merged.jsonl"
    ok(mmirage("merge", "--config", made.config, "--output-path", merged, env=env))
    check_complete(read_jsonl(merged), QUESTIONS)


def test_the_key_is_written_nowhere(example: ExampleRun, grid: GridRun) -> None:
    for root in (example.out, grid.root):
        for path in root.rglob("*"):
            if path.is_file():
                assert KEY.encode() not in path.read_bytes(), path
    for result in (example.run, example.check_wait, example.merge_default, grid.run, grid.merge):
        assert KEY not in result.out + result.err
