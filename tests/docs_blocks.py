"""The code blocks of the documentation (docs/**/*.md and README.md), as the tests run them.

A block is a fenced code block, also one indented inside a list or an admonition. An HTML
comment on the line before it steers it: ``<!-- docs-test: skip: <reason> -->`` leaves it out,
``<!-- docs-test: continue -->`` runs a Python block after the page's earlier ones, in one script.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
PAGES = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md"]
SECTIONS = ("processors", "loading_params", "processing_params", "execution_params")
FULL_CONFIG = {"processors", "loading_params", "processing_params"}

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^\n`]*)$")
_MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<verb>skip|continue)\s*(?::\s*(?P<why>.*?))?\s*-->")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    skip: str | None = None  # the reason, when skipped
    continues: bool = False

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def yaml_kind(self) -> str | None:
        """``config`` (a whole pipeline), ``fragment`` (some sections), or None (not a config)."""
        if self.lang not in ("yaml", "yml"):
            return None
        data = yaml.safe_load(self.text)
        if not isinstance(data, dict) or not data:
            return None
        keys = set(data)
        if FULL_CONFIG <= keys <= set(SECTIONS):
            return "config"
        return "fragment" if keys <= set(SECTIONS) else None


def blocks(page: Path) -> Iterator[Block]:
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening or not opening["info"].strip():
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        lang = opening["info"].strip().split()[0].lstrip(".{").rstrip("}").lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        marker = _previous_marker(lines, i)
        verb = marker["verb"] if marker else None
        yield Block(
            page=page,
            line=i + 1,
            lang=lang,
            text="\n".join(body) + "\n",
            skip=(marker["why"] or "no reason given") if marker and verb == "skip" else None,
            continues=verb == "continue",
        )
        i = j + 1


def _previous_marker(lines: list[str], index: int) -> re.Match[str] | None:
    for k in range(index - 1, -1, -1):
        if lines[k].strip():
            return _MARKER.search(lines[k])
    return None


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def python_scripts() -> list[tuple[Block, str]]:
    """Each runnable Python block with the script it runs as (earlier blocks first when it
    continues them)."""
    scripts: list[tuple[Block, str]] = []
    for page in PAGES:
        earlier: list[str] = []
        for block in blocks(page):
            if block.lang not in ("python", "py"):
                continue
            script = "\n".join([*earlier, block.text]) if block.continues else block.text
            earlier = [*earlier, block.text] if block.continues else [block.text]
            scripts.append((block, script))
    return scripts


def mmirage_command_lines(text: str) -> Iterator[list[str]]:
    """Every ``mmirage …`` command in a shell block, split into words (continuations joined)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for raw in joined.splitlines():
        line = raw.split(" #", 1)[0].strip().removeprefix("$ ")
        for part in re.split(r"&&|\|\||;|\|", line):
            try:
                words = shlex.split(part.strip().rstrip("&"))
            except ValueError:
                continue
            while words and "=" in words[0] and not words[0].startswith("-"):
                words = words[1:]  # VAR=value prefixes
            if words and Path(words[0]).name == "mmirage":
                yield words[1:]


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged
