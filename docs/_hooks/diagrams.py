"""MkDocs hook: the pictures of the docs, rendered from their Graphviz sources at build time.

Each ``docs/diagrams/NAME.dot`` becomes ``diagrams/NAME.svg`` in the site (a page shows it with
``![…](diagrams/NAME.svg)``); the sources themselves are not published. Graphviz's ``dot``
(Debian's ``graphviz`` package) draws them offline; without it the build stops and says so.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

SOURCES = "diagrams"
MISSING_TOOL = (
    "The docs' diagrams need Graphviz's `dot` on PATH: install it "
    "(`apt-get install graphviz`, or `brew install graphviz`) and build again."
)


def dot_command() -> str:
    """The path of ``dot``, or a one-sentence PluginError saying how to install it."""
    found = shutil.which("dot")
    if found is None:
        raise PluginError(MISSING_TOOL)
    return found


def render(source: Path, dot: str) -> bytes:
    """``source`` drawn as SVG. A source Graphviz refuses, or warns about (the build is
    strict: a warning is a picture drawn other than meant), fails with Graphviz's own words."""
    done = subprocess.run([dot, "-Tsvg", str(source)], capture_output=True, check=False)
    said = done.stderr.decode(errors="replace").strip()
    if done.returncode != 0 or not done.stdout or said:
        why = said or f"exit status {done.returncode}"
        raise PluginError(f"docs/{SOURCES}/{source.name}: Graphviz could not draw it: {why}")
    return done.stdout


def on_config(config: Any, **_: Any) -> Any:
    # Checked first, so a missing tool is the one message rather than a broken image later.
    dot_command()
    return config


def on_files(files: Files, config: Any, **_: Any) -> Files:
    dot = dot_command()
    for source_file in [f for f in files if f.src_uri.startswith(f"{SOURCES}/")]:
        if not source_file.src_uri.endswith(".dot"):
            continue
        files.remove(source_file)
        svg_uri = source_file.src_uri.removesuffix(".dot") + ".svg"
        svg = render(Path(source_file.abs_src_path or ""), dot)
        files.append(File.generated(config, svg_uri, content=svg))
    return files
