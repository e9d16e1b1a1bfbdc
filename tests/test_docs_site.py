"""The generated reference pages show every config field and every CLI option, and refuse to
build when one has no description (the hooks of docs/_hooks/, as MkDocs runs them)."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import click
import pytest
from mkdocs.exceptions import PluginError

from mmirage.cli import main
from mmirage.config.field_docs import reachable_dataclasses, yaml_fields
from mmirage.config.models import MMirageConfig
from mmirage.config.provider_resolution import BatchProviderConfigRegistry

HOOKS = Path(__file__).resolve().parents[1] / "docs" / "_hooks"


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


config_reference = _hook("config_reference")
cli_reference = _hook("cli_reference")


def test_every_yaml_field_has_a_row() -> None:
    page = config_reference.reference()
    classes = [
        *reachable_dataclasses(MMirageConfig),
        *map(BatchProviderConfigRegistry.get_config_cls, BatchProviderConfigRegistry.available()),
    ]
    missing = [
        f"{cls.__name__}.{f.name}"
        for cls in classes
        for f in yaml_fields(cls)
        if f"| `{f.name}` |" not in page and f.name != "provider_config"
    ]
    assert not missing


def test_the_types_read_as_yaml() -> None:
    page = config_reference.reference()
    assert '| `mode` | "local" \\| "slurm" \\| "ray" | `"local"` |' in page
    assert "| `num_shards` | int ≥ 1 | `1` |" in page
    assert "| `datasets` | list[mapping] | `[]` |" in page


def test_a_field_without_a_description_fails_the_build() -> None:
    @dataclass
    class Undocumented:
        """A section."""

        depth: int = 1

    with pytest.raises(PluginError, match=r"Undocumented\.depth has no description"):
        config_reference.table(config_reference.Block("x", Undocumented))


def test_every_cli_option_has_a_row() -> None:
    page = cli_reference.reference()
    root = click.Context(main, info_name="mmirage")
    walked = list(cli_reference.commands(main, root))
    paths = {ctx.command_path for _, ctx in walked}
    assert {"mmirage run", "mmirage merge", "mmirage emulate", "mmirage job status"} <= paths
    for command, ctx in walked:
        assert f"`{ctx.command_path}`" in page
        for param in command.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert f"`{param.opts[0]}`" in page, f"{ctx.command_path} {param.opts[0]}"


def test_an_option_without_help_fails_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    @click.command(help="Does a thing.")
    @click.option("--quietly", is_flag=True)
    def thing(quietly: bool) -> None: ...

    monkeypatch.setitem(main.commands, "thing", thing)
    with pytest.raises(PluginError, match="mmirage thing --quietly"):
        cli_reference.reference()
