"""Every example of the documentation runs as written, against the provider emulator.

Python blocks run as scripts, each in its own interpreter; whole YAML configs go through
``mmirage run`` (then ``check --wait`` and ``merge`` when they submit batches); YAML fragments
load onto a small base config; every ``mmirage`` command line in a shell block names a real
command and real options. Each runs in a fresh directory where the repo's ``examples/`` and
``configs/`` are reachable as the pages write them, with the emulator behind the providers'
``*_BASE_URL`` variables, so the pages show the real providers' usage.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from conftest import TEST_KEY
from docs_blocks import REPO, Block, all_blocks, deep_merge, mmirage_command_lines, python_scripts
from mmirage.cli import main as mmirage_cli
from mmirage.config import load_mmirage_config
from provider_emulator import EmulatorConfig, running_emulator

MMIRAGE = Path(sys.executable).with_name("mmirage")
SHARED_FOLDERS = ("examples", "configs")
BLOCK_TIMEOUT_S = 180
# A processor for each output type, for fragments that give outputs but no processors.
BASE_PROCESSORS: dict[str, dict[str, Any]] = {
    "llm": {"type": "llm", "message_format": "openai", "model": "gpt-4o-mini"},
    "batch_api": {"type": "batch_api", "provider": "openai", "model": "gpt-4o-mini"},
    "custom": {
        "type": "custom",
        "script_path": "examples/recipes/custom_function.py",
        "function_name": "triage",
    },
}
BASE_CONFIG: dict[str, Any] = {
    "processors": [BASE_PROCESSORS["llm"]],
    "loading_params": {
        "datasets": [
            {"path": "examples/quickstart/data.jsonl", "type": "JSONL", "output_dir": "out/base"}
        ]
    },
    "processing_params": {
        "inputs": [{"name": "review", "key": "review"}],
        "outputs": [{"name": "answer", "type": "llm", "prompt": "{{ review }}"}],
        "output_schema": {"answer": "{{ answer }}"},
    },
}

BLOCKS = all_blocks()


def _ids(blocks: list[Block]) -> list[str]:
    return [block.id for block in blocks]


@pytest.fixture(scope="module")
def docs_env() -> Iterator[dict[str, str]]:
    with running_emulator(EmulatorConfig()) as emu:
        yield {
            **os.environ,
            "OPENAI_BASE_URL": emu.openai_base_url,
            "ANTHROPIC_BASE_URL": emu.url,
            "GEMINI_BASE_URL": emu.gemini_base_url,
            "OPENAI_API_KEY": TEST_KEY,
            "ANTHROPIC_API_KEY": TEST_KEY,
            "GEMINI_API_KEY": TEST_KEY,
        }


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for name in SHARED_FOLDERS:
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def _run(args: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    assert done.returncode == 0, f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}"


def _skip_if_marked(block: Block) -> None:
    if block.skip:
        pytest.skip(f"{block.id}: {block.skip}")


# -- Python --------------------------------------------------------------------------------

SCRIPTS = python_scripts()


@pytest.mark.parametrize(("block", "script"), SCRIPTS, ids=_ids([b for b, _ in SCRIPTS]))
def test_python_block_runs(
    block: Block, script: str, workdir: Path, docs_env: dict[str, str]
) -> None:
    _skip_if_marked(block)
    (workdir / "block.py").write_text(script)
    _run([sys.executable, "block.py"], workdir, docs_env, f"the Python block at {block.id}")


# -- YAML ----------------------------------------------------------------------------------

CONFIGS = [b for b in BLOCKS if b.yaml_kind == "config"]
FRAGMENTS = [b for b in BLOCKS if b.yaml_kind == "fragment"]


@pytest.mark.parametrize("block", CONFIGS, ids=_ids(CONFIGS))
def test_yaml_config_runs(block: Block, workdir: Path, docs_env: dict[str, str]) -> None:
    _skip_if_marked(block)
    (workdir / "config.yaml").write_text(block.text)
    run = [str(MMIRAGE), "run", "--config", "config.yaml"]
    _run(run, workdir, docs_env, f"mmirage run on the config at {block.id}")
    outputs = yaml.safe_load(block.text)["processing_params"].get("outputs", [])
    if any(output.get("type") == "batch_api" for output in outputs):
        for command in (
            ["check", "--wait", "--poll-interval", "0.2"],
            ["merge", "--output-path", "out/merged.jsonl"],
        ):
            args = [str(MMIRAGE), *command, "--config", "config.yaml"]
            _run(args, workdir, docs_env, f"mmirage {command[0]} on the config at {block.id}")


@pytest.mark.parametrize("block", FRAGMENTS, ids=_ids(FRAGMENTS))
def test_yaml_fragment_loads(block: Block, workdir: Path, docs_env: dict[str, str]) -> None:
    _skip_if_marked(block)
    merged = config_around(yaml.safe_load(block.text))
    (workdir / "config.yaml").write_text(yaml.safe_dump(merged))
    os.chdir(workdir)  # relative paths in the fragment are the page's working directory
    try:
        load_mmirage_config(str(workdir / "config.yaml"))
    finally:
        os.chdir(REPO)


def config_around(fragment: dict[str, Any]) -> dict[str, Any]:
    """The base config with ``fragment`` in it, the rest adjusted to fit: outputs for the
    fragment's processors, processors for its outputs, a row schema for its outputs."""
    merged = deep_merge(copy.deepcopy(BASE_CONFIG), fragment)
    params = merged["processing_params"]
    given = fragment.get("processing_params", {})
    if "processors" in fragment and "outputs" not in given:
        params["outputs"] = [
            {
                "name": f"out_{i}",
                "type": processor["type"],
                **({"processor": processor["name"]} if processor.get("name") else {}),
                **({"prompt": "{{ review }}"} if processor["type"] in ("llm", "batch_api") else {}),
            }
            for i, processor in enumerate(merged["processors"])
        ]
    if "processors" not in fragment and "outputs" in given:
        kinds = dict.fromkeys(output.get("type", "llm") for output in params["outputs"])
        merged["processors"] = [BASE_PROCESSORS[kind] for kind in kinds]
    if "output_schema" in given:  # the row's shape is the fragment's, not a merge with ours
        params["output_schema"] = given["output_schema"]
    else:
        params["output_schema"] = {o["name"]: f"{{{{ {o['name']} }}}}" for o in params["outputs"]}
    return merged


def test_every_yaml_block_is_a_config_a_fragment_or_marked() -> None:
    """A YAML block that is none of these would silently go untested."""
    unknown = [
        b.id for b in BLOCKS if b.lang in ("yaml", "yml") and b.yaml_kind is None and not b.skip
    ]
    assert not unknown, f"YAML blocks that are neither a config nor a fragment: {unknown}"


# -- shell ---------------------------------------------------------------------------------

SHELL = [b for b in BLOCKS if b.lang in ("bash", "sh", "shell", "console") and not b.skip]
COMMANDS = [(b, words) for b in SHELL for words in mmirage_command_lines(b.text)]


def _unknown_options(words: list[str]) -> list[str]:
    command: click.Command = mmirage_cli
    problems: list[str] = []
    takes_value = False
    for word in words:
        if takes_value:  # the previous option's value
            takes_value = False
            continue
        if word.startswith("-"):
            name = word.split("=", 1)[0]
            options = {opt: p for p in command.params for opt in (*p.opts, *p.secondary_opts)}
            param = options.get(name)
            if param is None and name not in ("-h", "--help"):
                problems.append(f"{name} (not an option of {command.name})")
            takes_value = isinstance(param, click.Option) and not param.is_flag and "=" not in word
        elif isinstance(command, click.Group):
            sub = command.get_command(click.Context(command), word)
            if sub is None:
                return [*problems, f"{word} (not a command of {command.name})"]
            command = sub
    return problems


@pytest.mark.parametrize(
    ("block", "words"), COMMANDS, ids=[f"{b.id}:{' '.join(w)[:40]}" for b, w in COMMANDS]
)
def test_shell_command_names_real_options(block: Block, words: list[str]) -> None:
    assert not _unknown_options(words), f"{block.id}: mmirage {' '.join(words)}"


def test_the_option_check_catches_a_typo() -> None:
    assert _unknown_options(["run", "--config", "c.yaml"]) == []
    assert _unknown_options(["--log-level", "DEBUG", "merge", "--wait"]) == []
    assert _unknown_options(["run", "--confg", "c.yaml"])
    assert _unknown_options(["mrege"])
