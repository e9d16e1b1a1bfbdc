"""``mmirage --version``: which mmirage this is, and where it was installed from.

The name ``mmirage`` on PyPI belongs to another project (the original MMIRAGE), so the version
line says that this is MMIRAGE + llm_kit and where the install came from: pip records it in the
distribution's ``direct_url.json`` (PEP 610): a checkout (editable or not), a git URL and its
commit, or a wheel file. A checkout that is a git work tree adds its commit; a wheel that
``make dist`` built carries the commit it was built from in ``mmirage/BUILD_COMMIT``.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import click

PROJECT = "MMIRAGE + llm_kit"
BUILD_COMMIT = Path(__file__).resolve().parents[1] / "BUILD_COMMIT"


def _direct_url() -> dict[str, Any] | None:
    """pip's record of where mmirage was installed from (a source tree may also hold an
    ``egg-info`` without one: the installed record is the one that has it)."""
    for dist in importlib.metadata.distributions(name="mmirage"):
        text = dist.read_text("direct_url.json")
        if text:
            return dict(json.loads(text))
    return None


def _git_commit(tree: Path) -> str | None:
    """The short commit of a git work tree (``+changes`` when files differ from it)."""
    try:
        described = subprocess.run(
            ["git", "-C", str(tree), "describe", "--always", "--dirty=+changes", "--abbrev=12"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if described.returncode != 0:  # not a git work tree, or git refuses it
        return None
    return described.stdout.strip() or None


def _built_commit() -> str | None:
    try:
        return BUILD_COMMIT.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def origin() -> str:
    """Where this mmirage came from, in words."""
    record = _direct_url()
    if record is None:  # run from a source tree on sys.path, or installed by another tool
        package = Path(__file__).resolve().parents[1]
        source = package.parents[1] if package.parent.name == "src" else package
        commit = _git_commit(source) or _built_commit()
        return f"from {source}" + (f" at git {commit}" if commit else "")
    url = str(record.get("url", ""))
    vcs_commit = record.get("vcs_info", {}).get("commit_id")
    if vcs_commit:
        return f"from the git repository {url} at git {vcs_commit[:12]}"
    location = unquote(urlparse(url).path) if url.startswith("file:") else url
    if "archive_info" in record:
        commit = _built_commit()
        return f"from the wheel {location}" + (f", built at git {commit}" if commit else "")
    kind = "editable checkout" if record.get("dir_info", {}).get("editable") else "checkout"
    commit = _git_commit(Path(location)) if url.startswith("file:") else None
    return f"from the {kind} {location}" + (f" at git {commit}" if commit else "")


def show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """The ``--version`` option's callback: computed only when asked (it may run git)."""
    if not value or ctx.resilient_parsing:
        return
    version = importlib.metadata.version("mmirage")
    click.echo(f"mmirage {version} ({PROJECT}, {origin()})")
    ctx.exit(0)
