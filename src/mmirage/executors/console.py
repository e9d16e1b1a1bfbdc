"""Output shared by the executors: a table, and stderr lines below a live status line."""

from __future__ import annotations

import shutil
import sys
import threading

import click


def print_table(lines: list[list[str]]) -> None:
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]) - 1)]
    for line in lines:
        padded = [v.ljust(w) for v, w in zip(line, widths, strict=False)]
        click.echo("  ".join([*padded, line[-1]]).rstrip())


class Console:
    """Lines from several shards, whole and one at a time; on a terminal, one status line kept
    below them (cleared before each line and drawn again after it, cut to the terminal's
    width)."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self._lock = threading.Lock()
        self._status = ""

    def line(self, text: str) -> None:
        with self._lock:
            self._clear()
            click.echo(text, err=True)
            self._draw()

    def status(self, text: str) -> None:
        if not self.live:
            return
        with self._lock:
            self._clear()
            self._status = text
            self._draw()

    def close(self) -> None:
        with self._lock:
            self._clear()
            self._status = ""

    def _clear(self) -> None:
        if self.live and self._status:
            sys.stderr.write("\r\033[K")

    def _draw(self) -> None:
        if self.live and self._status:
            sys.stderr.write(_fitted(self._status))
            sys.stderr.flush()


def _fitted(text: str) -> str:
    """``text`` cut to the terminal's width: a status line that wrapped could not be cleared
    (``\r`` goes back to the start of its last row only)."""
    width = shutil.get_terminal_size().columns - 1
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
