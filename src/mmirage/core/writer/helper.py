"""Arrow shards written by a helper process, beside the run rather than after it.

Publishing an HF or Parquet shard costs its process ``import pyarrow`` (numpy with it, about
0.15 s of CPU) and the conversion of the part file. ``ArrowHelper.start()`` launches
``python -m mmirage.core.writer.helper`` when a shard's work begins: it imports pyarrow while
the first requests go out, on another core. At publish, ``write`` asks it to convert the part
file with the same ``formats.write_dataset`` the run would call itself, and waits.

The helper only ever saves time. Any other answer than success (it could not start, it died,
the conversion raised) makes ``write`` convert in this process, which raises what a user must
see (a full disk naming its file, a column that cannot be written). The helper has its own
process group, so a terminal's Ctrl-C reaches the run alone; the run decides, and ``close``
stops a busy helper with SIGTERM, which unwinds its conversion and removes the temporary
sibling as an in-process one would. A run that dies closes the helper's input: it ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from types import FrameType
from typing import IO, Any

import orjson

from mmirage.core.writer.formats import Format, iter_jsonl, write_dataset

logger = logging.getLogger(__name__)

ARROW_FORMATS: frozenset[str] = frozenset({"hf", "parquet"})
STOP_WAIT_S = 10.0  # how long close() waits for the helper to end


class ArrowHelper:
    """A helper process that writes part files as Arrow datasets; see the module docstring.
    Not started, or gone, it costs nothing: ``write`` converts in this process."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._busy = False  # a conversion was asked and not answered

    @classmethod
    def start(cls, fmt: Format) -> ArrowHelper:
        """A helper starting now for shards in ``fmt`` (its imports run while the caller goes
        on); for a format that needs no Arrow, none."""
        helper = cls()
        if fmt not in ARROW_FORMATS:
            return helper
        try:
            helper._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, fmt],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # Its failures are answered, or end it (the run then converts by itself).
                stderr=None if logger.isEnabledFor(logging.DEBUG) else subprocess.DEVNULL,
                process_group=0,  # a terminal's Ctrl-C is the run's to handle, not the helper's
            )
        except OSError as exc:
            logger.debug("no Arrow helper process (%s): shards are converted in this one", exc)
        return helper

    def write(self, part: Path, dest: Path, fmt: Format) -> None:
        """Write the JSONL part file ``part`` as ``dest`` in ``fmt`` (``write_dataset``)."""
        if fmt in ARROW_FORMATS and self._ask(part, dest, fmt):
            return
        write_dataset(partial(iter_jsonl, part), dest, fmt)

    @property
    def running(self) -> bool:
        """Whether there is a helper to ask (started, and not found dead)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def send(self, part: Path, dest: Path, fmt: Format) -> bool:
        """Ask the helper to write ``part`` as ``dest``, without waiting; whether it was asked."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        job = {"part": os.fspath(part), "dest": os.fspath(dest), "format": fmt}
        self._busy = True
        try:
            proc.stdin.write(orjson.dumps(job) + b"\n")
            proc.stdin.flush()
        except OSError:  # it died
            self.close()
            return False
        return True

    def _ask(self, part: Path, dest: Path, fmt: Format) -> bool:
        """Whether the helper wrote it (``False``: it could not, or is gone)."""
        if not self.send(part, dest, fmt):
            return False
        assert self._proc is not None and self._proc.stdout is not None
        try:
            reply = self._proc.stdout.readline()
        except OSError:
            reply = b""
        if not reply:  # it died: nothing more to ask it
            self.close()
            logger.debug("the Arrow helper ended; converting %s in this process", part)
            return False
        self._busy = False
        answer = orjson.loads(reply)
        if answer.get("ok") is True:
            return True
        logger.debug("the Arrow helper could not write %s (%s)", dest, answer.get("error"))
        return False

    def close(self) -> None:
        """End the helper: at once when idle (its input closes), else by SIGTERM."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if self._busy:
            proc.terminate()
        if proc.stdin is not None:
            with contextlib.suppress(OSError):  # a dead helper's pipe may fail to flush
                proc.stdin.close()
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> ArrowHelper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(jobs: IO[bytes], replies: IO[bytes]) -> None:
    """The helper's side: one JSON job per line in, one JSON answer per line out."""
    for line in jobs:
        job = orjson.loads(line)
        answer: dict[str, Any]
        try:
            part = Path(job["part"])
            write_dataset(partial(iter_jsonl, part), Path(job["dest"]), job["format"])
            answer = {"ok": True}
        except Exception as exc:  # answered: the run converts again and raises it itself
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        replies.write(orjson.dumps(answer) + b"\n")
        replies.flush()


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(1)  # unwinds write_dataset, which removes its temporary sibling


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    # Imported now, before the first job asks for them.
    import pyarrow

    if sys.argv[1:] == ["parquet"]:
        import pyarrow.parquet  # noqa: F401

    serve(sys.stdin.buffer, sys.stdout.buffer)
    # Every answer is flushed and nothing else is held: skip the interpreter's teardown (tens
    # of milliseconds with pyarrow loaded), which the run would wait for.
    os._exit(0)


if __name__ == "__main__":
    main()
