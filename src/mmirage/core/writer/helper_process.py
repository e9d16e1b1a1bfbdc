"""The Arrow helper's own side (``python -m mmirage.core.writer.helper_process``); the run's
side, and why there is a helper, is ``helper``.

Jobs come one JSON object per line, each naming a part file, its published path and format:

* ``{"op": "grow", …, "upto": N}``: the run appended to the part file, whose first ``N`` bytes
  are written (whole lines; durable or not: a conversion is published only after the run's
  last checkpoint). Its conversion begins (``GrowingPart``), or reads on to ``N``. Not
  answered: the run does not wait.
* ``{"op": "write", …, "upto": N}``: the run publishes. The conversion under way reads to
  ``N`` and ends; with none (or ``upto`` null, or one for another path or format) the part
  file is converted whole. Answered ``{"ok": true}`` or ``{"ok": false, "error": "…"}``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from types import FrameType
from typing import IO, Any

import orjson

from mmirage.core.writer.formats import (
    Format,
    FormatError,
    iter_jsonl,
    jsonl_batches,
    write_dataset,
)

# What converting to each format imports.
PRELOADED = {"hf": ["pyarrow"], "parquet": ["pyarrow", "pyarrow.parquet"]}
NICENESS = 10  # added to the run's: the helper yields the CPU to it


class GrowingPart:
    """One part file converted while the run appends to it: a writer thread runs
    ``write_dataset`` over the rows checkpointed so far and waits for more. A second reading
    of the rows (a batch changed the schema: ``formats._write_arrow``) waits for the end."""

    def __init__(self, part: Path, dest: Path, fmt: Format) -> None:
        self.part, self.dest, self.format = part, dest, fmt
        self._changed = threading.Condition()
        self._upto = 0  # bytes of the part file written so far
        self._final = False  # the run publishes: no more bytes come
        self._abandoned = False
        self._streamed = False
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._write, name=f"convert {part}", daemon=True)
        self._thread.start()

    def grow(self, upto: int, *, final: bool = False) -> None:
        with self._changed:
            self._upto, self._final = max(self._upto, upto), final
            self._changed.notify_all()

    def finish(self, upto: int) -> Exception | None:
        """Read to ``upto``, end the conversion; its error, if it failed."""
        if upto < self._upto:  # what was read is not this file any more: never publish it
            self.abandon()
            return FormatError(f"{self.part} shrank while it was converted")
        self.grow(upto, final=True)
        self._thread.join()
        return self.error

    def abandon(self) -> None:
        """Stop the conversion (it removes what it wrote) and wait for it to end."""
        with self._changed:
            self._abandoned = True
            self._changed.notify_all()
        self._thread.join()

    def _write(self) -> None:
        try:
            write_dataset(self._batches, self.dest, self.format)
        except Exception as exc:  # answered at finish(): the run converts again, and raises
            self.error = exc

    def _batches(self) -> Iterator[list[dict[str, Any]]]:
        if self._streamed:
            self._wait(lambda: self._final)
            return self._checked(iter_jsonl(self.part))
        self._streamed = True
        return self._checked(jsonl_batches(self._lines(), self.part))

    def _checked(self, batches: Iterator[list[dict[str, Any]]]) -> Iterator[list[dict[str, Any]]]:
        for batch in batches:
            if self._abandoned:
                raise FormatError(f"the conversion of {self.part} was stopped")
            yield batch

    def _lines(self) -> Iterator[bytes]:
        """The part file's lines as they are written (one at a time: a helper that falls
        behind must not hold what it has yet to convert)."""
        read = 0
        with open(self.part, "rb") as f:
            while True:
                upto, final = self._written_past(read)
                while read < upto:
                    line = f.readline(upto - read)  # never past what was said written
                    if not line:
                        raise FormatError(f"{self.part} shrank while it was converted")
                    read += len(line)
                    yield line
                if final:
                    return

    def _written_past(self, read: int) -> tuple[int, bool]:
        """Once the part file is written past ``read`` bytes, or final: (its length, final)."""
        return self._wait(lambda: self._final or self._upto > read)

    def _wait(self, ready: Callable[[], bool]) -> tuple[int, bool]:
        with self._changed:
            self._changed.wait_for(lambda: self._abandoned or ready())
            if self._abandoned:
                raise FormatError(f"the conversion of {self.part} was stopped")
            return self._upto, self._final


class Jobs:
    """The helper's state: the conversions under way, by part file."""

    def __init__(self) -> None:
        self.growing: dict[Path, GrowingPart] = {}

    def run(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """Do one job; its answer, if it has one."""
        op = job["op"]
        if op not in ("grow", "write"):  # a run of another version: ending is all we can do
            raise ValueError(f"unknown job {op!r}")
        part, dest, fmt = Path(job["part"]), Path(job["dest"]), job["format"]
        upto: int | None = job.get("upto")
        growing = self.growing.get(part)
        if growing is not None and ((growing.dest, growing.format) != (dest, fmt) or upto is None):
            growing.abandon()  # not the conversion this job asks for
            del self.growing[part]
            growing = None
        if op == "grow":
            if growing is None:
                growing = self.growing[part] = GrowingPart(part, dest, fmt)
            growing.grow(int(upto or 0))
            return None
        error: Exception | None = None
        if growing is not None and upto is not None:
            error = growing.finish(upto)
            del self.growing[part]  # kept until finished: a SIGTERM meanwhile abandons it
        else:
            try:
                write_dataset(partial(iter_jsonl, part), dest, fmt)
            except Exception as exc:  # answered: the run converts again and raises it itself
                error = exc
        if error is None:
            return {"ok": True}
        return {"ok": False, "error": f"{type(error).__name__}: {error}"}

    def abandon_all(self) -> None:
        for growing in self.growing.values():
            growing.abandon()
        self.growing.clear()


def serve(jobs: IO[bytes], answers: IO[bytes]) -> None:
    """One JSON job per line in, one JSON answer per line out (for the jobs that have one)."""
    state = Jobs()
    try:
        for line in jobs:
            answer = state.run(orjson.loads(line))
            if answer is not None:
                answers.write(orjson.dumps(answer) + b"\n")
                answers.flush()
    finally:  # the run ended, or stopped us: what is half-written goes
        state.abandon_all()


def preload(modules: list[str]) -> None:
    """Import ``modules`` now, before the first job asks for them, and pyarrow without numpy:
    pyarrow imports it (about 0.15 s of CPU, most of its own import) only to convert to and
    from numpy arrays, which converting JSON rows never does, so the helper's pyarrow has no
    numpy support. numpy itself stays importable: datasets, which lays out a shard too large
    for one data file, imports it and works (a test converts such a shard here). A pyarrow
    that cannot be imported without numpy is imported with it."""
    blocked = "numpy" not in sys.modules
    if blocked:
        sys.modules["numpy"] = None  # type: ignore[assignment]  # None: its import fails
    try:
        importlib.import_module("pyarrow")
    except ImportError:
        sys.modules.pop("numpy", None)
        blocked = False
        importlib.import_module("pyarrow")
    finally:
        if blocked:
            del sys.modules["numpy"]
    for module in modules:
        importlib.import_module(module)


def _stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: the run stopped while it waited for an answer. Unwinding the conversion under
    way removes its temporary sibling; a second SIGTERM must not cut that short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(1)


def main() -> None:
    signal.signal(signal.SIGTERM, _stop)
    # Answers go out on their own descriptor; what a library prints goes to stderr, never
    # into the answers.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    # Second to the run on a busy machine: the run's requests are what cost a user time; a
    # conversion that falls behind catches up once they are done (the part file holds it).
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    preload(PRELOADED[sys.argv[1]])
    serve(sys.stdin.buffer, answers)
    # Every answer is flushed and nothing else is held: skip the interpreter's teardown (tens
    # of milliseconds with pyarrow loaded), which the run would wait for.
    os._exit(0)


if __name__ == "__main__":
    main()
