"""`mmirage --help` stays fast: the CLI module imports none of the heavy packages."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("llm_kit", "pydantic", "datasets", "pyarrow", "jinja2", "aiohttp", "yaml")


def test_cli_import_loads_no_heavy_package() -> None:
    probe = f"import sys, mmirage.cli\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_help_lists_every_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mmirage", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("run", "check", "merge", "merge-dir", "stats", "emulate", "job"):
        assert f"  {command} " in done.stdout, command


def test_commands_load_when_asked_for() -> None:
    probe = (
        "import sys, click, mmirage.cli as cli\n"
        "commands = {target.split(':')[0] for target in cli.COMMANDS.values()}\n"
        "before = [m for m in sys.modules if m in commands]\n"
        "ctx = click.Context(cli.main)\n"
        "loaded = {name: cli.main.get_command(ctx, name).name for name in cli.COMMANDS}\n"
        "print(before, loaded == {name: name for name in cli.COMMANDS})\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[] True"


def test_plain_input_keys_are_read_without_jmespath() -> None:
    # Most inputs[].key are plain field paths: checked and read without importing JMESPath
    # (a run's start-up); any other key still is JMESPath.
    probe = """
import sys
from mmirage.config.processing_params import InputVar
from mmirage.core.render.variables import VariableExtractor
plain = [InputVar(name="q", key="question"), InputVar(name="n", key="meta.n")]
rows = [{"question": "why?", "meta": {"n": 2}}]
assert VariableExtractor(plain).extract_each(rows)[0] == [{"q": "why?", "n": 2}]
print("jmespath" in sys.modules)
VariableExtractor([InputVar(name="first", key="items[0]")])
print("jmespath" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]
