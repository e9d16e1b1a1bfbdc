"""The one place where an exception becomes an exit code and one sentence on stderr.

Exit codes: 0 done; 1 the work failed (``WorkFailed``, an llm_kit error); 2 the user must fix
something first (``UserError``, llm_kit's ``ConfigError``). A traceback only at DEBUG.
"""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import NoReturn

import click

from mmirage.errors import UserError, WorkFailed

WORK_FAILED, USER_ERROR = 1, 2


def _rules() -> tuple[tuple[type[BaseException], int], ...]:
    """Most specific first. llm_kit is imported only once an error is being handled: importing
    it up front would slow every command."""
    from llm_kit.errors import ConfigError as KitConfigError  # a missing API key, bad options
    from llm_kit.errors import LLMKitError

    return (
        (UserError, USER_ERROR),
        (KitConfigError, USER_ERROR),
        (WorkFailed, WORK_FAILED),
        (LLMKitError, WORK_FAILED),
    )


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of a known error; ``None`` for anything else (a bug: let it show)."""
    for kind, code in _rules():
        if isinstance(exc, kind):
            return code
    return None


def debug() -> bool:
    return logging.getLogger().isEnabledFor(logging.DEBUG)


def report(exc: BaseException) -> int:
    """Print ``exc`` as ``error: <sentence>`` (its traceback too at DEBUG); its exit code."""
    code = exit_code_for(exc)
    assert code is not None, exc
    if debug():
        logging.getLogger(__name__).exception("the traceback (--log-level DEBUG)")
    click.echo(f"error: {exc}", err=True)
    return code


@contextmanager
def exit_on_errors(codes: Collection[int] = (WORK_FAILED, USER_ERROR)) -> Iterator[None]:
    """A known error whose exit code is in ``codes`` ends the command with that code; any
    other exception goes on (a caller may retry a failed shard)."""
    try:
        yield
    except Exception as exc:
        if exit_code_for(exc) not in codes:
            raise
        sys.exit(report(exc))


def user_errors_exit_2() -> AbstractContextManager[None]:
    """Only the user's errors end the command (exit 2); a failure of the work goes on."""
    return exit_on_errors((USER_ERROR,))


def code_of(work: Callable[[], int]) -> int:
    """``work()``'s exit code, or that of the known error it raised (printed)."""
    try:
        return work()
    except Exception as exc:
        if exit_code_for(exc) is None:
            raise
        return report(exc)


def os_failure(exc: OSError, field: str) -> NoReturn:
    """A path the user must fix is a ``UserError`` naming it (``field``: the option that chose
    it); any other OS error (disk full, I/O) is a failed merge, a ``WorkFailed``."""
    from mmirage.core.shard.state import is_path_problem, unusable_dir

    if is_path_problem(exc):
        raise unusable_dir(exc, Path(exc.filename or "."), field) from exc
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = exc.filename or f"the {field}"
        raise WorkFailed(
            f"no space left on the device of {where}; free space there or choose another {field}"
        ) from exc
    raise WorkFailed(str(exc)) from exc
