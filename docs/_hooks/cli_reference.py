"""MkDocs hook: the CLI Reference, generated from the ``mmirage`` click commands.

``<!-- cli-reference -->`` in a page becomes a section per command (its help, usage and a
table of its options with type, default and description). A command without help, or an
option without ``help=``, fails the build.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import click
from mkdocs.exceptions import PluginError

from mmirage.cli import main

MARKER = "<!-- cli-reference -->"


def commands(
    command: click.Command, ctx: click.Context
) -> Iterator[tuple[click.Command, click.Context]]:
    """``command`` and every visible subcommand below it, depth first, by name."""
    yield command, ctx
    for name, sub in subcommands(command, ctx):
        yield from commands(sub, click.Context(sub, info_name=name, parent=ctx))


def subcommands(command: click.Command, ctx: click.Context) -> list[tuple[str, click.Command]]:
    """The visible subcommands of a group, by name (asked for: a lazy group imports them)."""
    if not isinstance(command, click.Group):
        return []
    found = [(name, command.get_command(ctx, name)) for name in command.list_commands(ctx)]
    return sorted((name, sub) for name, sub in found if sub is not None and not sub.hidden)


def undocumented(command: click.Command, ctx: click.Context) -> list[str]:
    path = ctx.command_path
    missing = [path] if not (command.help or "").strip() else []
    return missing + [
        f"{path} {param.opts[-1]}"
        for param in command.params
        if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip()
    ]


def _help_text(text: str) -> str:
    # click's "\b" keeps a paragraph's line breaks; in Markdown a line break needs two spaces.
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        if paragraph.lstrip().startswith("\b"):
            lines = paragraph.lstrip()[1:].strip("\n").splitlines()
            paragraphs.append("  \n".join(line.strip() for line in lines))
        else:
            paragraphs.append(" ".join(paragraph.split()))
    return "\n\n".join(paragraphs)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(param: click.Option, ctx: click.Context) -> str:
    value = param.get_default(ctx, call=False)
    if param.is_flag or not isinstance(value, str | int | float) or value == "":
        return ""  # unset, computed, or said in the help
    return f"`{value}`"


def _kind(param: click.Option, ctx: click.Context) -> str:
    """What the option takes: ``flag``, ``integer ≥ 1``, ``a | b``, ``PATH``."""
    kind = param.type
    if param.is_flag and not param.secondary_opts:
        return "flag"
    if isinstance(kind, click.IntRange | click.FloatRange):
        name = "integer" if isinstance(kind, click.IntRange) else "number"
        low = "" if kind.min is None else f"{'>' if kind.min_open else '≥'} {kind.min}"
        high = "" if kind.max is None else f"{'<' if kind.max_open else '≤'} {kind.max}"
        return " ".join(part for part in (name, low, high) if part)
    if isinstance(kind, click.Choice):
        return " | ".join(f"`{choice}`" for choice in kind.choices)
    return param.make_metavar(ctx)


def _option_row(param: click.Option, ctx: click.Context) -> str:
    names = ", ".join(f"`{name}`" for name in (*param.opts, *param.secondary_opts))
    kind = _kind(param, ctx)
    if param.multiple:
        kind += " (repeatable)"
    return f"| {names} | {_cell(kind)} | {_default(param, ctx)} | {_cell(param.help or '')} |"


def section(command: click.Command, ctx: click.Context) -> str:
    level = "#" * min(2 + ctx.command_path.count(" "), 4)
    lines = [f"{level} `{ctx.command_path}`", "", _help_text(command.help or ""), ""]
    pieces = command.collect_usage_pieces(ctx)
    lines += ["```text", f"{ctx.command_path} {' '.join(pieces)}", "```", ""]
    options = [p for p in command.params if isinstance(p, click.Option) and not p.hidden]
    if options:
        lines += ["| Option | Takes | Default | Description |", "| --- | --- | --- | --- |"]
        lines += [_option_row(p, ctx) for p in options]
        lines += ["| `-h`, `--help` | flag |  | Show the command's help and exit. |", ""]
    if isinstance(command, click.Group):
        lines += ["Commands:", ""]
        for name, sub in subcommands(command, ctx):
            anchor = f"{ctx.command_path} {name}".replace(" ", "-")
            lines.append(f"- [`{name}`](#{anchor}): {sub.get_short_help_str(limit=200)}")
        lines.append("")
    return "\n".join(lines)


def reference() -> str:
    root = click.Context(main, info_name="mmirage")
    walked = list(commands(main, root))
    missing = [name for command, ctx in walked for name in undocumented(command, ctx)]
    if missing:
        raise PluginError(f"CLI reference: no description for {', '.join(missing)}")
    return "\n".join(section(command, ctx) for command, ctx in walked)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return markdown.replace(MARKER, reference()) if MARKER in markdown else markdown
