"""A processor type from a user's own module: named in MMIRAGE_PROCESSORS, it registers a
config dataclass, an output dataclass and a ``Processor`` subclass, and ``mmirage run`` uses
``type: shout`` from YAML against the emulator, with no edit to mmirage."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

from batch_spec_support import cli_env, mmirage, shard_rows, write_rows, write_yaml

# The user's module: everything a new processor type needs, and nothing else.
PLUGIN = '''
import asyncio
import json
import os
import urllib.request
from dataclasses import dataclass
from typing import ClassVar, Literal

from mmirage.core.process import OutputResult, Processor, register_processor_type


@dataclass
class ShoutConfig:
    TYPE: ClassVar[str] = "shout"
    type: Literal["shout"] = "shout"
    name: str | None = None
    base_url: str = ""
    model: str = "m"


@dataclass
class ShoutOutput:
    TYPE: ClassVar[str] = "shout"
    name: str = ""
    prompt: str = ""
    type: Literal["shout"] = "shout"
    processor: str | None = None


class ShoutProcessor(Processor):
    """Asks an OpenAI-compatible server, and upper-cases its answer."""

    def __init__(self, config, context=None):
        self.config = config
        self.key = os.environ["SHOUT_API_KEY"]  # fails at build time, before any row

    def _ask(self, prompt):
        body = {"model": self.config.model, "messages": [{"role": "user", "content": prompt}]}
        request = urllib.request.Request(
            self.config.base_url + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": "Bearer " + self.key, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        return answer["choices"][0]["message"]["content"]

    async def process(self, output, requests):
        texts = await asyncio.gather(*(asyncio.to_thread(self._ask, r.prompt) for r in requests))
        return [OutputResult(value=text.upper(), input_tokens=1, output_tokens=1) for text in texts]


register_processor_type(ShoutConfig, ShoutOutput, ShoutProcessor)
'''


def _config(tmp_path: Path, base_url: str) -> Path:
    rows = [{"id": i, "text": f"row {i}"} for i in range(5)]
    return write_yaml(
        tmp_path / "config.yaml",
        {
            "processors": [{"type": "shout", "base_url": base_url}],
            "loading_params": {
                "datasets": [
                    {
                        "path": write_rows(tmp_path / "in.jsonl", rows),
                        "type": "JSONL",
                        "output_dir": str(tmp_path / "out"),
                    }
                ],
                "state_dir": str(tmp_path / "state"),
                "output_format": "jsonl",
            },
            "processing_params": {
                "inputs": [{"name": "id", "key": "id"}, {"name": "text", "key": "text"}],
                "outputs": [{"name": "loud", "type": "shout", "prompt": "say {{ text }}"}],
                "output_schema": {"id": "{{ id }}", "loud": "{{ loud }}"},
            },
        },
    )


def _plugin(tmp_path: Path) -> str:
    module = f"shout_plugin_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLUGIN))
    return module


def test_a_processor_type_from_a_users_module_runs_through_the_cli(
    tmp_path: Path, emulator: Any
) -> None:
    config = _config(tmp_path, emulator.openai_base_url)
    env = cli_env(
        MMIRAGE_PROCESSORS=_plugin(tmp_path),
        PYTHONPATH=str(tmp_path),
        SHOUT_API_KEY="shout-test-key",
    )
    run = mmirage("run", config, env=env)
    assert run.code == 0, run
    rows = sorted(shard_rows(tmp_path / "out"), key=lambda r: r["id"])
    assert [(r["id"], r["loud"]) for r in rows] == [(i, f"ECHO: SAY ROW {i}") for i in range(5)]
    assert all(r["__errors__"] is None for r in rows)


def test_without_the_plugin_the_type_is_one_sentence_naming_the_field(
    tmp_path: Path, emulator: Any
) -> None:
    config = _config(tmp_path, emulator.openai_base_url)
    run = mmirage("check", config, env=cli_env())
    assert run.code == 2, run
    assert len(run.error_lines) == 1, run
    assert "processors[0].type" in run.error_lines[0] and "'shout'" in run.error_lines[0], run


def test_a_plugin_that_fails_to_import_is_named(tmp_path: Path) -> None:
    config = _config(tmp_path, "http://127.0.0.1:9/v1")
    run = mmirage("check", config, env=cli_env(MMIRAGE_PROCESSORS="no_such_shout_module"))
    assert run.code == 2, run
    assert len(run.error_lines) == 1, run
    assert "MMIRAGE_PROCESSORS" in run.error_lines[0], run
    assert "no_such_shout_module" in run.error_lines[0], run


def _installed(tmp_path: Path, entry: str) -> Path:
    """A package installed into ``tmp_path/site`` whose entry point (group
    ``mmirage.processors``) is ``entry``, as pip would leave it."""
    site = tmp_path / "site"
    info = site / "shout_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shout-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[mmirage.processors]\nshout = {entry}\n")
    return site


def test_an_installed_entry_point_is_read_for_a_type_mmirage_does_not_know(
    tmp_path: Path, emulator: Any
) -> None:
    config = _config(tmp_path, emulator.openai_base_url)
    module = _plugin(tmp_path)
    site = _installed(tmp_path, module)
    env = cli_env(PYTHONPATH=f"{site}:{tmp_path}", SHOUT_API_KEY="shout-test-key")
    run = mmirage("run", config, env=env)
    assert run.code == 0, run
    rows = sorted(shard_rows(tmp_path / "out"), key=lambda r: r["id"])
    assert [r["loud"] for r in rows] == [f"ECHO: SAY ROW {i}" for i in range(5)]


def test_a_broken_entry_point_fails_only_the_configs_that_need_a_plugin(
    tmp_path: Path, emulator: Any
) -> None:
    site = _installed(tmp_path, "no_such_shout_module")
    env = cli_env(PYTHONPATH=str(site))
    run = mmirage("check", _config(tmp_path, emulator.openai_base_url), env=env)
    assert run.code == 2, run
    assert len(run.error_lines) == 1, run
    line = run.error_lines[0]
    assert "processors[0].type" in line and "no_such_shout_module" in line, run
    # A config of built-in types never reads the installed plugins.
    builtin = write_yaml(
        tmp_path / "builtin.yaml",
        {
            "processors": [{"type": "llm", "base_url": emulator.openai_base_url, "model": "m"}],
            "loading_params": {
                "datasets": [
                    {
                        "path": str(tmp_path / "in.jsonl"),
                        "type": "JSONL",
                        "output_dir": str(tmp_path / "out2"),
                    }
                ],
                "state_dir": str(tmp_path / "state2"),
            },
            "processing_params": {
                "inputs": [{"name": "text", "key": "text"}],
                "outputs": [{"name": "answer", "type": "llm", "prompt": "{{ text }}"}],
                "output_schema": {"answer": "{{ answer }}"},
            },
        },
    )
    run = mmirage("run", builtin, env={**env, "OPENAI_API_KEY": "sk-emulator"})
    assert run.code == 0, run


def test_a_module_named_in_the_environment_overrides_an_installed_plugin(
    tmp_path: Path, emulator: Any
) -> None:
    config = _config(tmp_path, emulator.openai_base_url)
    site = _installed(tmp_path, _plugin(tmp_path))
    override = f"quiet_plugin_{uuid.uuid4().hex[:8]}"
    quiet = textwrap.dedent(PLUGIN).replace("text.upper()", "text.lower()")
    (tmp_path / f"{override}.py").write_text(quiet)
    env = cli_env(
        MMIRAGE_PROCESSORS=override,
        PYTHONPATH=f"{site}:{tmp_path}",
        SHOUT_API_KEY="shout-test-key",
    )
    run = mmirage("run", config, env=env)
    assert run.code == 0, run
    rows = sorted(shard_rows(tmp_path / "out"), key=lambda r: r["id"])
    assert [r["loud"] for r in rows] == [f"echo: say row {i}" for i in range(5)]
