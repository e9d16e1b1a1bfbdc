"""Arrow shards written by a helper process, beside the run rather than after it.

Publishing an HF or Parquet shard costs its process ``import pyarrow`` (numpy with it, about
0.15 s of CPU) and the conversion of the part file (about 5 µs a row). ``ArrowHelper.start()``
launches ``python -m mmirage.core.writer.helper_process`` when a shard's work begins: it
imports pyarrow while the first requests go out. Each group of rows appended to a part file
tells it how far the file is written (``grow``: whole lines, flushed), and it converts those rows
meanwhile, on its own core; at publish, after the last checkpoint, ``write`` tells it where the
file ends and waits for the last rows only. The
conversion is ``formats.write_dataset``, the code the run would call itself, batch for batch.

The helper only ever saves time. Any other answer than success (it could not start, it died,
the conversion raised) makes ``write`` convert in this process, which raises what a user must
see (a full disk naming its file, a column that cannot be written). The helper has its own
process group, so a terminal's Ctrl-C reaches the run alone; the run decides. ``close`` (or a
run that dies) closes the helper's input: it drops what it had begun, removing the temporary
siblings as an in-process conversion would, and ends. A publish under way when the run stops
is stopped by SIGTERM; one past its last rows may still finish (a published shard whose
checkpoint is not complete is published again by the next run). Temporary siblings left by a
helper killed outright are removed when the shard next opens (``ShardOutput.open``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import orjson

from mmirage.core.writer.formats import Format, iter_jsonl, write_dataset

logger = logging.getLogger(__name__)

ARROW_FORMATS: frozenset[str] = frozenset({"hf", "parquet"})
HELPER_MODULE = "mmirage.core.writer.helper_process"
STOP_WAIT_S = 10.0  # how long close() waits for the helper to end


class ArrowHelper:
    """A helper process that writes part files as Arrow datasets; see the module docstring.
    Not started, or gone, it costs nothing: ``write`` converts in this process."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._awaiting = False  # an answer is awaited: close() must stop what it is doing
        self._sending = threading.RLock()  # checkpoints run in threads; close() may cut in

    @classmethod
    def start(cls, fmt: Format) -> ArrowHelper:
        """A helper starting now for shards in ``fmt`` (its imports run while the caller goes
        on); for a format that needs no Arrow, none."""
        helper = cls()
        if fmt not in ARROW_FORMATS:
            return helper
        try:
            helper._proc = subprocess.Popen(
                # -P: the working directory is not on its path (a user's datasets.py there
                # is not the run's either).
                [sys.executable, "-P", "-m", HELPER_MODULE, fmt],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # Its failures are answered (logged at DEBUG), or end it (the run then converts
                # by itself); in its own process group, a write to a terminal could stop it.
                stderr=subprocess.DEVNULL,
                process_group=0,  # a terminal's Ctrl-C is the run's to handle, not the helper's
            )
        except OSError as exc:
            logger.debug("no Arrow helper process (%s): shards are converted in this one", exc)
        return helper

    @property
    def running(self) -> bool:
        """Whether there is a helper to ask (started, and not found dead)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """The helper's process id (``None``: none was started)."""
        return None if self._proc is None else self._proc.pid

    def grow(self, part: Path, dest: Path, fmt: Format, upto: int) -> bool:
        """``part``'s first ``upto`` bytes are written (whole lines): the helper converts them
        meanwhile.
        Whether it was told (``False``: no helper, or not an Arrow format)."""
        return fmt in ARROW_FORMATS and self.send(
            {"op": "grow", **_names(part, dest, fmt), "upto": upto}
        )

    def write(self, part: Path, dest: Path, fmt: Format, upto: int | None = None) -> None:
        """Write the JSONL part file ``part`` as ``dest`` in ``fmt`` (``write_dataset``).
        ``upto``: the part file's length, when every checkpoint of it was ``grow``n."""
        if fmt in ARROW_FORMATS and self._ask(part, dest, fmt, upto):
            return
        write_dataset(partial(iter_jsonl, part), dest, fmt)

    def send(self, job: dict[str, object]) -> bool:
        """Hand the helper ``job`` without waiting; whether it was handed."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return False
        line = orjson.dumps(job) + b"\n"
        with self._sending:
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
            except OSError:  # it died
                self.close()
                return False
        return True

    def _ask(self, part: Path, dest: Path, fmt: Format, upto: int | None) -> bool:
        """Whether the helper wrote it (``False``: it could not, or is gone)."""
        if not self.send({"op": "write", **_names(part, dest, fmt), "upto": upto}):
            return False
        self._awaiting = True
        assert self._proc is not None and self._proc.stdout is not None
        try:
            reply = self._proc.stdout.readline()
        except (OSError, ValueError):
            reply = b""
        try:
            answer = orjson.loads(reply)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):  # it died, or said something else than an answer
            self.close()  # stopped (SIGTERM) before the run writes the same dest
            logger.debug("the Arrow helper gave no answer; converting %s in this process", part)
            return False
        self._awaiting = False
        if answer.get("ok") is True:
            return True
        logger.debug("the Arrow helper could not write %s (%s)", dest, answer.get("error"))
        return False

    def close(self) -> None:
        """End the helper. Its input closes, so it drops the conversions it was told of (the
        run did not publish them) and ends; one whose answer is awaited (the run stopped in
        the middle of a publish) is stopped by SIGTERM."""
        with self._sending:  # not while a checkpoint's thread writes to it
            proc, self._proc = self._proc, None
            if proc is None:
                return
            if self._awaiting:
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


def _names(part: Path, dest: Path, fmt: Format) -> dict[str, str]:
    """The paths and format every job names."""
    return {"part": os.fspath(part), "dest": os.fspath(dest), "format": fmt}
