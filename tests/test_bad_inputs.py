"""A corpus of bad configs, bad command lines and bad rows, each run through the real CLI.

Every case is a ``mmirage`` subprocess in its own directory. A configuration or usage error
exits 2, a failed piece of work exits 1; either way stderr holds one readable sentence that
names the file, line or field at fault, and never a traceback (that only with
``--log-level DEBUG``). A bad *row* does not stop the run: it is published with its error
recorded in ``__errors__``, naming the file and line, the field, or the image.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

MMIRAGE = Path(sys.executable).with_name("mmirage")
CONFIG = "pipeline.yaml"
UNSET = "MMIRAGE_TEST_SURELY_UNSET_VARIABLE"

Config = dict[str, Any]

SCRIPT = """\
def upper(variables):
    return variables["text"].upper()


def picky(variables):
    if variables["text"] == "bad":
        raise ValueError("no way: " + variables["text"])
    return variables["text"].upper()
"""

BASE: Config = {
    "processors": [{"type": "custom", "script_path": "script.py", "function_name": "upper"}],
    "loading_params": {
        "state_dir": "state",
        "datasets": [{"path": "data.jsonl", "type": "JSONL", "output_dir": "out"}],
        "batch_size": 2,
    },
    "processing_params": {
        "inputs": [{"name": "text", "key": "text"}],
        "outputs": [{"name": "loud", "type": "custom"}],
        "output_schema": {"loud": "{{ loud }}"},
    },
}
GOOD_ROWS = [{"text": "alpha"}, {"text": "beta"}, {"text": "gamma"}]


def mmirage(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    command = [str(MMIRAGE)] if MMIRAGE.exists() else [sys.executable, "-m", "mmirage"]
    environ = {k: v for k, v in os.environ.items() if k != UNSET}
    environ.update({"XDG_CACHE_HOME": str(cwd / "cache"), **(env or {})})
    return subprocess.run(
        [*command, *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=120
    )


def write_jsonl(path: Path, rows: list[Any]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def setup_dir(root: Path, config: Config | str, data: str | None = None) -> None:
    (root / "script.py").write_text(SCRIPT)
    if data is None:
        write_jsonl(root / "data.jsonl", GOOD_ROWS)
    else:
        (root / "data.jsonl").write_text(data)
    text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
    (root / CONFIG).write_text(text)


def assert_no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert 'File "' not in stderr, stderr


def assert_one_sentence(stderr: str, expected: list[str]) -> None:
    """Exactly one line on stderr, an ``error:`` sentence holding every expected fragment."""
    assert_no_traceback(stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    for fragment in expected:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


# -- bad configurations and command lines: exit 2 ----------------------------------------------


Mutation = Callable[[Config], None]


def with_(*mutations: Mutation) -> Config:
    """A copy of BASE with the mutations applied, in order."""
    config = copy.deepcopy(BASE)
    for mutate in mutations:
        mutate(config)
    return config


def _llm(**fields: Any) -> Mutation:
    """The output computed by an ``llm`` processor with these fields instead of the script."""

    def mutate(config: Config) -> None:
        config["processors"] = [{"type": "llm", **fields}]
        config["processing_params"]["outputs"] = [
            {"name": "loud", "type": "llm", "prompt": "Say {{ text }}"}
        ]

    return mutate


def _output(**fields: Any) -> Mutation:
    def mutate(config: Config) -> None:
        config["processing_params"]["outputs"][0].update(fields)

    return mutate


def _append(path: str, value: Any) -> Mutation:
    def mutate(config: Config) -> None:
        section, key = path.split(".")
        config[section][key].append(value)

    return mutate


def _schema(**fields: Any) -> Mutation:
    def mutate(config: Config) -> None:
        config["processing_params"]["output_schema"].update(fields)

    return mutate


EMULATOR_NOWHERE = {"base_url": "http://127.0.0.1:9/v1", "model": "m"}  # never called


@dataclass(frozen=True)
class Case:
    id: str
    config: Config | str
    expected: list[str]  # fragments of the one stderr sentence
    command: list[str] = field(default_factory=lambda: ["run", CONFIG])
    code: int = 2


def _set(path: str, value: Any) -> Callable[[Config], None]:
    def mutate(config: Config) -> None:
        node: Any = config
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return mutate


def _del(path: str) -> Callable[[Config], None]:
    def mutate(config: Config) -> None:
        node: Any = config
        *parents, last = path.split(".")
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[last]

    return mutate


CONFIG_CASES = [
    Case(
        "unknown_top_level_key",
        with_(_set("procesing_params", {})),
        [CONFIG, "procesing_params", "unknown key"],
    ),
    Case(
        "unknown_nested_key",
        with_(_set("loading_params.datasets.0.outptu_dir", "x")),
        [CONFIG, "loading_params.datasets[0].outptu_dir", "output_dir"],
    ),
    Case(
        "missing_section",
        with_(_del("processing_params")),
        [CONFIG, "processing_params", "required"],
    ),
    Case(
        "wrong_type",
        with_(_set("loading_params.batch_size", "many")),
        [CONFIG, "loading_params.batch_size", "'many'"],
    ),
    Case(
        "wrong_type_list_for_mapping",
        with_(_set("processing_params.inputs", {"name": "text"})),
        [CONFIG, "processing_params.inputs"],
    ),
    Case(
        "out_of_range_value",
        with_(_set("loading_params.num_shards", 0)),
        [CONFIG, "loading_params.num_shards"],
    ),
    Case(
        "shard_id_beyond_num_shards",
        with_(_set("loading_params.shard_id", 3)),
        [CONFIG, "loading_params.shard_id", "num_shards"],
    ),
    Case(
        "bad_combination_slurm_without_account",
        with_(_set("execution_params", {"mode": "slurm"})),
        [CONFIG, "execution_params.account", "slurm"],
    ),
    Case(
        "bad_combination_output_without_its_processor",
        with_(_output(type="llm", prompt="x")),
        [CONFIG, "processing_params.outputs[0]", "llm"],
    ),
    Case(
        "bad_dataset_type",
        with_(_set("loading_params.datasets.0.type", "xlsx")),
        [CONFIG, "loading_params.datasets[0].type", "'xlsx'"],
    ),
    Case(
        "shared_output_dir",
        with_(
            _append(
                "loading_params.datasets",
                {"path": "data.jsonl", "type": "JSONL", "output_dir": "out"},
            )
        ),
        [CONFIG, "loading_params.datasets[1].output_dir"],
    ),
    Case(
        "undefined_prompt_variable",
        with_(_llm(**EMULATOR_NOWHERE), _output(prompt="Say {{ txet }}")),
        [CONFIG, "processing_params.outputs[0].prompt", "'txet'"],
    ),
    Case(
        "undefined_schema_variable",
        with_(_set("processing_params.output_schema", {"loud": "{{ lowd }}"})),
        [CONFIG, "processing_params.output_schema.loud", "'lowd'"],
    ),
    Case(
        "bad_jinja_syntax",
        with_(_set("processing_params.output_schema", {"loud": "{{ loud "})),
        [CONFIG, "processing_params.output_schema.loud", "Jinja"],
    ),
    Case(
        "bad_jmespath",
        with_(_set("processing_params.inputs.0.key", "text[")),
        [CONFIG, "processing_params.inputs[0].key", "JMESPath"],
    ),
    Case(
        "json_output_without_schema",
        with_(_llm(**EMULATOR_NOWHERE), _output(output_type="JSON")),
        [CONFIG, "processing_params.outputs[0].output_schema", "JSON"],
    ),
    Case(
        "output_schema_min_above_max",
        with_(
            _llm(**EMULATOR_NOWHERE),
            _output(
                output_type="JSON", output_schema={"score": {"type": "int", "min": 9, "max": 2}}
            ),
        ),
        [CONFIG, "output_schema.score", "min 9 cannot be greater than max 2"],
    ),
    Case(
        "unresolved_env_var",
        with_(_set("loading_params.datasets.0.output_dir", f"${{{UNSET}}}/out")),
        [CONFIG, "loading_params.datasets[0].output_dir", UNSET],
    ),
    Case(
        "malformed_env_reference",
        with_(_set("loading_params.state_dir", "${OOPS")),
        [CONFIG, "loading_params.state_dir", "${OOPS"],
    ),
    Case(
        "invalid_yaml",
        "processors:\n  - type: custom\n   script_path: x\n",
        [CONFIG, "YAML", "line 3"],
    ),
    Case(
        "top_level_not_a_mapping",
        "- processors\n- loading_params\n",
        [CONFIG, "mapping"],
    ),
    Case("config_file_not_found", "", ["nowhere.yaml", "not found"], ["run", "nowhere.yaml"]),
    Case(
        "missing_dataset_path",
        with_(_set("loading_params.datasets.0.path", "no/such/data.jsonl")),
        ["no/such/data.jsonl"],
    ),
    Case(
        "missing_loadable_dataset",
        with_(
            _set(
                "loading_params.datasets.0",
                {"path": "no_such_dir", "type": "loadable", "output_dir": "out"},
            )
        ),
        ["no_such_dir"],
    ),
    Case(
        "custom_script_missing",
        with_(_set("processors.0.script_path", "missing_script.py")),
        ["script_path", "missing_script.py"],
    ),
    Case(
        "custom_function_missing",
        with_(_set("processors.0.function_name", "shout")),
        ["function_name", "shout"],
    ),
    Case(
        "llm_without_api_key",
        with_(_llm(message_format="openai", model="gpt-4o-mini")),
        ["no API key for openai", "export OPENAI_API_KEY="],
    ),
    Case(
        "batch_api_without_api_key",
        with_(
            _set("processors", [{"type": "batch_api", "provider": "openai", "model": "m"}]),
            _set(
                "processing_params.outputs",
                [{"name": "loud", "type": "batch_api", "prompt": "Say {{ text }}"}],
            ),
        ),
        ["batch_api provider 'openai' needs OPENAI_API_KEY", "export OPENAI_API_KEY="],
    ),
    Case(
        "api_key_in_the_config",
        with_(_llm(message_format="anthropic", model="claude", api_key="sk-ant-secret-in-yaml")),
        ["processors[0].api_key", "keys come only from the environment", "ANTHROPIC_API_KEY"],
    ),
    Case(
        "llm_model_path_without_server",
        with_(_llm(server_args={"model_path": "Qwen/Qwen3-4B"})),
        ["server_args.model_path", "base_url"],
    ),
    Case(
        "shard_id_option_out_of_range",
        BASE,
        ["--shard-id 5", "num_shards"],
        ["run", CONFIG, "--shard-id", "5"],
    ),
    Case(
        "check_with_a_bad_config",
        with_(_set("loading_params.batch_size", -1)),
        [CONFIG, "loading_params.batch_size"],
        ["check", CONFIG],
    ),
    Case(
        "merge_with_a_bad_config",
        with_(_set("loading_params.batch_size", -1)),
        [CONFIG, "loading_params.batch_size"],
        ["merge", CONFIG],
    ),
    # Work that cannot be done: exit 1.
    Case(
        "merge_of_unpublished_shards",
        with_(_set("loading_params.num_shards", 2)),
        ["2 of 2 shard(s)", "--allow-partial"],
        ["merge", CONFIG],
        code=1,
    ),
]


@pytest.mark.parametrize("case", CONFIG_CASES, ids=lambda c: c.id)
def test_bad_config_is_one_sentence_and_its_exit_code(case: Case, tmp_path: Path) -> None:
    setup_dir(tmp_path, case.config)
    done = mmirage(*case.command, cwd=tmp_path)
    assert done.returncode == case.code, done.stderr
    assert_one_sentence(done.stderr, case.expected)
    assert done.stdout == ""
    if case.code == 2 and case.command[0] == "run":
        # Refused before any row ran: nothing written, no attempt counted against the shard.
        assert not [p for p in tmp_path.glob("out/**/*") if p.is_file()]
        assert not list(tmp_path.glob("state/**/status.json"))
        if "API_KEY" in str(case.expected) or "keys come only" in str(case.expected):
            # What the environment lacks is checked before anything, even a folder, is made.
            assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()


USAGE_CASES = [
    ("no_config", ["run"], "mmirage run CONFIG (or mmirage run --config CONFIG)"),
    ("two_configs", ["check", CONFIG, "--config", "other.yaml"], "two configuration files"),
    ("unknown_option", ["run", CONFIG, "--bogus"], "--bogus"),
    ("bad_option_value", ["run", CONFIG, "--shard-id", "minus-one"], "--shard-id"),
    ("unknown_command", ["rnu", CONFIG], "rnu"),
    ("bad_log_level", ["--log-level", "LOUD", "run", CONFIG], "--log-level"),
]


@pytest.mark.parametrize(
    ("args", "fragment"), [c[1:] for c in USAGE_CASES], ids=[c[0] for c in USAGE_CASES]
)
def test_usage_error_exits_2_with_one_error_line(
    args: list[str], fragment: str, tmp_path: Path
) -> None:
    setup_dir(tmp_path, BASE)
    done = mmirage(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert_no_traceback(done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, done.stderr  # click's usage block, then one Error: sentence
    assert fragment in errors[0]


DEBUG_CASES = ["wrong_type", "missing_dataset_path", "custom_script_missing", "invalid_yaml"]


@pytest.mark.parametrize("case_id", DEBUG_CASES)
def test_debug_shows_the_traceback_and_keeps_exit_2(case_id: str, tmp_path: Path) -> None:
    case = next(c for c in CONFIG_CASES if c.id == case_id)
    setup_dir(tmp_path, case.config)
    done = mmirage("--log-level", "DEBUG", *case.command, cwd=tmp_path)
    assert "Traceback" in done.stderr
    assert done.returncode == 2, done.stderr[-2000:]


@pytest.mark.parametrize("case_id", DEBUG_CASES)
def test_debug_shows_the_traceback(case_id: str, tmp_path: Path) -> None:
    case = next(c for c in CONFIG_CASES if c.id == case_id)
    setup_dir(tmp_path, case.config)
    done = mmirage("--log-level", "DEBUG", *case.command, cwd=tmp_path)
    assert done.returncode != 0
    assert "Traceback" in done.stderr
    assert case.expected[-1] in done.stderr


# -- bad rows: recorded in the row, the run goes on -------------------------------------------


@dataclass(frozen=True)
class RowCase:
    id: str
    data: str
    bad_line: int  # 1-based line of data.jsonl whose row fails
    expected: list[str]  # fragments of that row's recorded error
    config: Config = field(default_factory=lambda: BASE)
    files: dict[str, bytes] = field(default_factory=dict)  # extra files in the run directory


def _image_config() -> Config:
    config = copy.deepcopy(BASE)
    config["loading_params"]["datasets"][0]["image_base_path"] = "images"
    config["processing_params"]["inputs"].append({"name": "picture", "key": "img", "type": "image"})
    return config


def _lines(*rows: Any) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


ROW_CASES = [
    RowCase(
        "malformed_jsonl_line",
        _lines({"text": "a"}, '{"text": "b"', {"text": "c"}),
        2,
        ["line 2", "data.jsonl", "not valid JSON"],
    ),
    RowCase(
        "jsonl_line_not_an_object",
        _lines({"text": "a"}, {"text": "b"}, "[1, 2, 3]"),
        3,
        ["line 3", "data.jsonl"],
    ),
    RowCase(
        "missing_input_field",
        _lines({"text": "a"}, {"txt": "b"}, {"text": "c"}),
        2,
        ["'text'", "missing"],
    ),
    RowCase(
        "null_input_field",
        _lines({"text": None}, {"text": "b"}, {"text": "c"}),
        1,
        ["'text'", "null"],
    ),
    RowCase(
        "image_not_found",
        _lines({"text": "a", "img": "nope.jpg"}, {"text": "b", "img": "ok.jpg"}),
        1,
        ["nope.jpg"],
        config=_image_config(),
        files={"images/ok.jpg": b"\xff\xd8\xff\xe0 not really a jpeg"},
    ),
    RowCase(
        "custom_function_raises",
        _lines({"text": "a"}, {"text": "b"}, {"text": "bad"}),
        3,
        ["ValueError", "no way: bad"],
        config=with_(_set("processors.0.function_name", "picky")),
    ),
    RowCase(
        "schema_attribute_of_null",
        _lines({"text": "a", "meta": {"who": "me"}}, {"text": "b"}),
        2,
        ["who"],
        config=with_(
            _append("processing_params.inputs", {"name": "meta", "key": "meta", "optional": True}),
            _schema(who="{{ meta.who }}"),
        ),
    ),
]


def _published_rows(out: Path) -> list[dict[str, Any]]:
    """The shard as published, whatever the output format (JSONL file or HF directory)."""
    shard = sorted(p for p in out.iterdir() if p.name.startswith("shard-0-of-1"))
    assert shard, list(out.iterdir())
    path = shard[0]
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    import datasets

    return list(datasets.load_from_disk(str(path)))


@pytest.mark.parametrize("case", ROW_CASES, ids=lambda c: c.id)
def test_bad_row_is_published_with_its_reason(case: RowCase, tmp_path: Path) -> None:
    setup_dir(tmp_path, case.config, case.data)
    for name, content in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    done = mmirage("run", CONFIG, cwd=tmp_path)
    assert_no_traceback(done.stderr)
    assert done.returncode in (0, 1), done.stderr  # never a crash, never "bad config"
    rows = _published_rows(tmp_path / "out")
    assert len(rows) == case.data.count("\n")  # no row lost, the bad one included
    errors = [row["__errors__"] for row in rows]
    bad = errors[case.bad_line - 1]
    assert bad, rows
    message = " ".join(str(v) for v in bad.values())
    for fragment in case.expected:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert "\n" not in message
    good = [i for i, e in enumerate(errors) if not e]
    assert good, "the good rows must still be computed"
    for i in good:
        assert rows[i]["loud"] == rows[i]["text"].upper()


@pytest.mark.parametrize("case", ROW_CASES[:3], ids=lambda c: c.id)
def test_bad_row_fails_the_run_with_one_sentence(case: RowCase, tmp_path: Path) -> None:
    setup_dir(tmp_path, case.config, case.data)
    done = mmirage("run", CONFIG, cwd=tmp_path)
    assert_no_traceback(done.stderr)
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    assert all(fragment in errors[0] for fragment in case.expected), errors[0]


def test_on_bad_row_fail_stops_at_the_first_malformed_line(tmp_path: Path) -> None:
    config = copy.deepcopy(BASE)
    config["loading_params"]["on_bad_row"] = "fail"
    setup_dir(tmp_path, config, _lines({"text": "a"}, '{"text": "b"', {"text": "c"}))
    done = mmirage("run", CONFIG, cwd=tmp_path)
    assert_no_traceback(done.stderr)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "line 2" in errors[0] and "data.jsonl" in errors[0], done.stderr
