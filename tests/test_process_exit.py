"""The ``mmirage`` process ends as ``sys.exit`` would (status, exit handlers, flushed streams),
without the interpreter's teardown; with another thread alive, the usual way."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mmirage.cli.process_exit import exit_status


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(
        """
        import atexit, sys, threading, time
        from pathlib import Path
        from mmirage.cli.process_exit import exit_without_teardown
        mark = Path(sys.argv[1])
        atexit.register(lambda: mark.write_text("exit handlers ran"))
        """
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "mark")],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (1, 1), (2, 2), (256 + 3, 3)])
def test_the_status_is_sys_exits(code: int | None, status: int) -> None:
    assert exit_status(code) == status


def test_a_message_is_printed_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_status("error: something") == 1
    assert capsys.readouterr().err == "error: something\n"


def test_handlers_run_and_buffered_output_is_flushed(tmp_path: Path) -> None:
    done = _run(
        """
        sys.stdout.write("buffered, no newline")
        sys.stderr.write("and on stderr")
        exit_without_teardown(2)
        """,
        tmp_path,
    )
    assert done.returncode == 2
    assert done.stdout == "buffered, no newline" and done.stderr == "and on stderr"
    assert (tmp_path / "mark").read_text() == "exit handlers ran"


def test_a_running_thread_is_waited_for(tmp_path: Path) -> None:
    done = _run(
        """
        def work():
            time.sleep(0.3)
            print("the thread finished", flush=True)
        threading.Thread(target=work).start()
        exit_without_teardown(0)
        """,
        tmp_path,
    )
    assert done.returncode == 0 and done.stdout == "the thread finished\n"
    assert (tmp_path / "mark").read_text() == "exit handlers ran"


def test_the_command_exits_with_its_status_and_says_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "mmirage", "check", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr == f"error: {missing}: config file not found.\n"
