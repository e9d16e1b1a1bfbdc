"""How the ``mmirage`` process ends: as ``sys.exit`` would, without the interpreter's teardown.

After a command, Python frees every module and object one by one and runs a last full garbage
collection: 60-130 ms measured at the end of every command, when everything is done and
written. Here the exit status and the exit handlers are the usual ones (``atexit``: logging's
flush, thread pools), the standard streams are flushed, then ``os._exit`` ends the process.
What mmirage writes is closed by the code that wrote it (journal lines go out unbuffered, part
files and state in ``with`` blocks or closed at publish), so no buffer waits for a finalizer. A
process that still has another thread running exits the usual way, which joins it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_status(code: str | int | None) -> int:
    """The status ``sys.exit(code)`` ends a process with (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def exit_without_teardown(code: str | int | None) -> NoReturn:
    """End the process as ``sys.exit(code)`` would, less the teardown (see the module doc)."""
    if threading.active_count() > 1:
        sys.exit(code)
    status = exit_status(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``| head``): Python's own status
            status = status or 120
    os._exit(status)
