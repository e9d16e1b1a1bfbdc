from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from provider_emulator import EmulatorConfig, running_emulator

TEST_KEY = "sk-test-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def emulator() -> Iterator[object]:
    """A plain emulator (echo responder, no faults) on a random free port."""
    with running_emulator(EmulatorConfig()) as emu:
        yield emu


@pytest.fixture(autouse=True, scope="session")
def _ctrl_c_delivered() -> None:
    """A suite started in the background (``pytest &``) inherits SIGINT ignored, which its
    children would keep: the tests that send Ctrl-C need it delivered."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _no_real_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's real keys, nor a provider URL moved by their shell."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


CLUSTER_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm-dev-cluster.sh"


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[None]:
    """The real single-node SLURM of scripts/slurm-dev-cluster.sh, up for the whole session
    (it installs Debian's packages when missing, as root). Skipped where it cannot run, except
    in CI, where the SLURM tests must run."""
    # One `up` at a time across pytest-xdist workers (and other suites on this machine): two at
    # once would both start slurmctld on the same ports and state folder.
    lock_path = Path(tempfile.gettempdir()) / "mmirage-slurm-dev-cluster.lock"
    with lock_path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        up = subprocess.run(["bash", str(CLUSTER_SCRIPT), "up"], capture_output=True, text=True)
    if up.returncode != 0:
        message = f"no SLURM dev cluster: {up.stderr.strip()[-500:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    conf = up.stdout.strip().rsplit("=", 1)[-1]
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield
    if previous is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = previous
