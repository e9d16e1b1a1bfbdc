"""Result files served damaged, for clients that must notice before they trust a download.

With ``batch_damaged_downloads = N`` the first N downloads of batch result files (every
provider; uploaded input files are never touched) come back damaged, in turn: empty, cut off
in the middle of a line, and with a byte that is not UTF-8 inside the first line. Later
downloads of the same file are whole, as after a flaky proxy or an interrupted transfer.
"""

from __future__ import annotations

from pathlib import Path

DAMAGES = ("empty", "torn", "invalid_utf8")


def damaged(data: bytes, kind: str) -> bytes:
    """``data`` as a damaged transfer of kind ``kind`` would deliver it."""
    if kind == "empty":
        return b""
    if kind == "torn":
        return data[: len(data) // 2]
    first_line = data.find(b"\n")
    middle = (first_line if first_line > 0 else len(data)) // 2
    return data[:middle] + b"\xff\xfe" + data[middle:]


class DamagedDownloads:
    """Counts result downloads; serves the first ``count`` of them damaged."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.served = 0  # damaged downloads served so far

    def take(self, path: Path) -> bytes | None:
        """The damaged bytes to serve for this download of ``path``; ``None``: serve it whole."""
        if self.left <= 0:
            return None
        self.left -= 1
        kind = DAMAGES[self.served % len(DAMAGES)]
        self.served += 1
        return damaged(path.read_bytes(), kind)


__all__ = ["DAMAGES", "DamagedDownloads", "damaged"]
