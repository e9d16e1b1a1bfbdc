"""The error sentences docs/troubleshooting.md quotes are the ones the CLI prints.

Each case provokes an error for real (an ``mmirage`` subprocess, as in test_bad_inputs) and
checks two things: the page quotes the sentence word for word, and what is printed matches
it, each ``<placeholder>`` (and ``...``) standing for any text. Change a message in the code
and this fails until the page says the same.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from test_bad_inputs import (
    BASE,
    CONFIG,
    Config,
    Mutation,
    _llm,
    _output,
    _set,
    mmirage,
    setup_dir,
    with_,
)

PAGE = Path(__file__).resolve().parents[1] / "docs" / "troubleshooting.md"
PLACEHOLDER = re.compile(r"<[A-Za-z_ ]+>|\.\.\.")


def _batch_api() -> tuple[Mutation, ...]:
    """Fresh values each call: a later mutation of one case must not reach another."""
    return (
        _set("processors", [{"type": "batch_api", "provider": "openai", "model": "gpt-4o-mini"}]),
        _set(
            "processing_params.outputs",
            [{"name": "loud", "type": "batch_api", "prompt": "Say {{ text }}"}],
        ),
    )


# A key for the checks that need one; the URL answers nothing: these errors come before any call.
FAKE_OPENAI = {
    "OPENAI_API_KEY": "sk-test-troubleshooting",
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
}
SLURM = _set("execution_params", {"mode": "slurm", "account": "acct"})


@dataclass(frozen=True)
class Entry:
    id: str
    quote: str  # as the page prints it
    config: Config | str = field(default_factory=lambda: BASE)
    command: tuple[str, ...] = ("run", CONFIG)
    code: int = 2
    env: dict[str, str] = field(default_factory=dict)
    data: str | None = None  # data.jsonl, when not the default rows
    # The quote is a whole stderr line after this prefix; None: it is part of a line (a row's
    # reason inside the run's summary).
    line_prefix: str | None = "error: "


def _pattern(quote: str) -> str:
    pieces = PLACEHOLDER.split(quote)
    return ".+?".join(re.escape(piece) for piece in pieces)


def _image_rows() -> str:
    return '{"text": "a", "img": "../secret.png"}\n'


IMAGES = (
    _set("loading_params.datasets.0.image_base_path", "images"),
    lambda c: c["processing_params"]["inputs"].append(
        {"name": "picture", "key": "img", "type": "image"}
    ),
)

ENTRIES = [
    Entry(
        "unknown_key_with_a_suggestion",
        "<file>: <key>: unknown key '<key>' (did you mean '<suggestion>'?); allowed keys: <keys>.",
        with_(_set("loading_params.datasets.0.outptu_dir", "x")),
    ),
    Entry(
        "missing_section",
        "<file>: <section>: is required.",
        {k: v for k, v in BASE.items() if k != "processing_params"},
    ),
    Entry(
        "wrong_type",
        "<file>: <field>: must be a valid integer, unable to parse string as an integer, "
        "got '<value>'.",
        with_(_set("loading_params.batch_size", "many")),
    ),
    Entry(
        "bad_yaml",
        "<file>: is not valid YAML (<problem> at line <n>).",
        "processors:\n  - type: custom\n   script_path: x\n",
    ),
    Entry("config_not_found", "<file>: config file not found.", command=("run", "nowhere.yaml")),
    Entry(
        "jmespath_typo",
        "<file>: processing_params.inputs[<i>].key: is not a valid JMESPath expression "
        "(<reason>): '<key>'.",
        with_(_set("processing_params.inputs.0.key", "text[")),
    ),
    Entry(
        "undefined_variable",
        "<file>: <field>: uses '<name>', which is neither an input nor an earlier output; "
        "available here: <names>.",
        with_(_set("processing_params.output_schema", {"loud": "{{ lowd }}"})),
    ),
    Entry(
        "missing_dataset_file",
        "<file>: dataset <i> (loading_params.datasets[<i>].path = '<path>'): "
        "no such file or directory (resolved to <absolute path>); "
        "fix the path in the config or create it",
        with_(_set("loading_params.datasets.0.path", "no/such/data.jsonl")),
    ),
    Entry(
        "llm_without_a_key",
        "no API key for <provider>: set <VARIABLE> in the environment (export <VARIABLE>=…)",
        with_(_llm(message_format="openai", model="gpt-4o-mini")),
    ),
    Entry(
        "batch_api_without_a_key",
        "the batch_api provider '<provider>' needs <VARIABLE> in the environment "
        "(export <VARIABLE>=...; keys are never read from the config, and --export-prompts "
        "makes a dry run without one)",
        with_(*_batch_api()),
    ),
    Entry(
        "custom_id_too_long",
        "<file>: processing_params.outputs[<i>].name: '<name>' cannot start a batch custom_id; "
        "use at most 40 letters, digits or underscores.",
        with_(
            *_batch_api(),
            _output(name="a" * 41),
            _set("processing_params.output_schema", {"loud": "x"}),
        ),
        env=FAKE_OPENAI,
    ),
    Entry(
        "batch_output_read_by_a_later_prompt",
        "<file>: processing_params.outputs[<i>].prompt: uses '<name>', a batch_api output whose "
        "value only exists after 'mmirage merge'; compute this output in a second pipeline over "
        "the merged file.",
        with_(
            *_batch_api(),
            lambda c: c["processing_params"]["outputs"].append(
                {"name": "again", "type": "batch_api", "prompt": "Repeat {{ loud }}"}
            ),
        ),
        env=FAKE_OPENAI,
    ),
    Entry(
        "oversized_request_rejected",
        "the request '<custom_id>' is <n> bytes (with its newline), more than max_chunk_bytes "
        "(<limit>); raise max_chunk_bytes, shorten the prompt or images, or set "
        "oversized_request_policy: isolate",
        with_(
            *_batch_api(),
            _set("processors.0.max_chunk_bytes", 100),
            _set("processors.0.oversized_request_policy", "reject"),
        ),
        env=FAKE_OPENAI,
    ),
    Entry(
        "image_outside_image_base_path",
        "image variable '<name>': '<path>' leads outside image_base_path '<base>' ('..' or a "
        "symlink), which is refused; keep the rows' image paths inside it",
        with_(*_batch_api(), *IMAGES),
        command=("run", CONFIG, "--export-prompts", "prompts.jsonl"),  # a dry run: no key
        code=1,
        data=_image_rows(),
        line_prefix=None,
    ),
    Entry(
        "output_dir_is_a_file",
        "<setting>: <path> is a file, not a directory; move the file away or choose another path",
        with_(_set("loading_params.datasets.0.output_dir", "data.jsonl/out")),
    ),
    Entry(
        "merge_of_unpublished_shards",
        "out: <n> of <m> shard(s) are not published (shard id(s) <ids>); run them with "
        "'mmirage run CONFIG' (or --shard-id K), or pass --allow-partial to merge the others",
        with_(_set("loading_params.num_shards", 2)),
        command=("merge", CONFIG),
        code=1,
    ),
    Entry(
        "check_retry_in_local_mode",
        "--retry resubmits SLURM tasks (mode: slurm); here run 'mmirage retry CONFIG'",
        command=("check", CONFIG, "--retry"),
    ),
    Entry(
        "slurm_without_sbatch",
        "mode: slurm needs SLURM's sbatch on PATH (or use mode: local)",
        with_(SLURM),
        env={"PATH": str(Path(sys.executable).parent)},  # python, and no SLURM
    ),
    Entry(
        "two_configuration_files",
        "Error: two configuration files (<a> and --config <b>): give one",
        command=("check", CONFIG, "--config", "other.yaml"),
        line_prefix="",
    ),
]


def _provoke(entry: Entry, root: Path) -> tuple[int, str]:
    setup_dir(root, entry.config, entry.data)
    (root / "images").mkdir()
    done = mmirage(*entry.command, cwd=root, env=entry.env)
    return done.returncode, done.stderr


def assert_printed(quote: str, stderr: str, line_prefix: str | None) -> None:
    pattern = _pattern(quote)
    if line_prefix is not None:
        pattern = f"^{re.escape(line_prefix)}{pattern}$"
    assert re.search(pattern, stderr, re.MULTILINE), f"{quote!r} not printed in:\n{stderr}"


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.id)
def test_the_page_quotes_what_the_cli_prints(entry: Entry, tmp_path: Path) -> None:
    assert entry.quote in PAGE.read_text(encoding="utf-8"), f"the page lost {entry.quote!r}"
    code, stderr = _provoke(entry, tmp_path)
    assert code == entry.code, stderr
    assert "Traceback" not in stderr, stderr
    assert_printed(entry.quote, stderr, entry.line_prefix)


def test_a_config_changed_under_a_batch_api_shard_is_computed_again(
    tmp_path: Path, emulator: Any
) -> None:
    env = {"OPENAI_API_KEY": "sk-test-troubleshooting", "OPENAI_BASE_URL": emulator.openai_base_url}
    setup_dir(tmp_path, with_(*_batch_api()))
    assert mmirage("run", CONFIG, cwd=tmp_path, env=env).returncode == 0
    setup_dir(tmp_path, with_(*_batch_api(), _set("processors.0.model", "gpt-4o")))
    done = mmirage("run", CONFIG, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "different configuration" not in done.stderr, done.stderr


def test_a_config_changed_under_a_live_shard_is_computed_again(tmp_path: Path) -> None:
    setup_dir(tmp_path, BASE)
    assert mmirage("run", CONFIG, cwd=tmp_path).returncode == 0
    setup_dir(tmp_path, with_(_set("processors.0.function_name", "picky")))
    done = mmirage("run", CONFIG, cwd=tmp_path)
    # Computed again (with the new function), not refused.
    assert "different configuration" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "shard 0/1: " in done.stderr, done.stderr


def test_a_placeholder_matches_any_text_and_nothing_else_does() -> None:
    assert_printed("no key for <provider>: set it", "error: no key for gemini: set it", "error: ")
    with pytest.raises(AssertionError):
        assert_printed("no key for <provider>.", "error: no key for gemini!", "error: ")
