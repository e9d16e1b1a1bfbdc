"""A real two-node Ray cluster, the counting emulator and ``mmirage`` commands, all inside one
loopback-only network namespace (``unshare -n``, then ``ip link set lo up``): there every Ray
process listens on 127.0.0.1 only, and each namespace has its own ports, so tests running at
once do not meet.

``in_namespace(spec)`` runs this file as a script inside a new namespace. The script starts
the emulator (``samples/counting_emulator.py``: every request logged as it arrives), a head
node and a worker node (each ``ray start --block`` in its own process group, so that killing
the group kills the whole node: raylet, workers and agents), writes the pipeline with the
emulator's URL, runs the ``commands`` one after another, optionally kills the worker node
while its shard is sending, and writes what happened to ``<workdir>/result.json``.

With ``spec["s3"]``, a ``moto_server`` too (``s3_support``): a bucket with the uploaded
files, its variables in the commands' environment, the published objects read back after.

Used by tests/test_ray_mode.py, tests/test_ray_object_storage.py and
benchmarks/ray_overhead.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import s3_support  # tests/: on sys.path under pytest, and as this script's folder

HERE = Path(__file__).resolve().parent
COUNTING_EMULATOR = HERE / "samples" / "counting_emulator.py"
BIN = Path(sys.executable).parent
HEAD_PORT = 6379  # the namespace's own loopback: no other test shares it
KEY = "sk-ray-test-0123456789abcdef"  # in the driver's environment only, never the nodes'


def can_unshare() -> str | None:
    """Why a loopback-only network namespace cannot be made here (``None``: it can)."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "unshare or ip is not installed"
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, text=True
    )
    return None if probe.returncode == 0 else f"unshare -n is not permitted: {probe.stderr}"


def in_namespace(spec: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """Run the scenario ``spec`` in a new loopback-only namespace; its result."""
    workdir = Path(spec["workdir"])
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spec.json").write_text(json.dumps(spec))
    script = f"ip link set lo up && exec {sys.executable} {Path(__file__)} {workdir}"
    done = subprocess.run(
        ["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, timeout=timeout
    )
    result_path = workdir / "result.json"
    if not result_path.exists():
        raise AssertionError(f"the namespace's driver wrote no result:\n{done.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(result_path.read_text())
    if "error" in result:
        raise AssertionError(f"{result['error']}\n{done.stderr[-4000:]}")
    result["driver_stderr"] = done.stderr
    return result


# -- inside the namespace ----------------------------------------------------------------------


def _start_emulator(log: Path, latency_s: float) -> tuple[subprocess.Popen[str], str]:
    emulator = subprocess.Popen(
        [sys.executable, str(COUNTING_EMULATOR), str(log), str(latency_s)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert emulator.stdout is not None
    ready = emulator.stdout.readline()
    assert "Emulator ready" in ready, ready
    return emulator, ready.split("OpenAI ", 1)[1].split()[0]


def _ray_node(args: list[str], log: Path, hide: str | None = None) -> subprocess.Popen[bytes]:
    """``ray start ARGS --block`` in its own session (one process group for the node); with
    ``hide``, in its own mount namespace where an empty tmpfs covers that folder."""
    command = [str(BIN / "ray"), "start", *args, "--block", "--disable-usage-stats"]
    if hide:
        inner = f"mount -t tmpfs none {hide} && exec {' '.join(command)}"
        command = ["unshare", "-m", "bash", "-c", inner]
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _running(proc: subprocess.Popen[str]) -> bool:
    """Without reaping it: ``wait4`` must get its resource usage."""
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None


def _alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _wait_for_nodes(ray: Any, count: int, deadline_s: float = 240) -> list[dict[str, Any]]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if not ray.is_initialized():
                ray.init(address=f"127.0.0.1:{HEAD_PORT}", logging_level="ERROR")
            nodes = _alive_nodes(ray)
            if len(nodes) >= count:
                return nodes
        time.sleep(1)
    raise AssertionError(f"the Ray cluster did not reach {count} nodes")


def _received(log: Path) -> int:
    return log.read_bytes().count(b'"recv"') if log.exists() else 0


def _files_holding(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` (Ray's logs and session files, state, outputs) holding it."""
    found = []
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink() and secret.encode() in path.read_bytes():
                found.append(str(path))
    return found


def _status(shard_dir: Path) -> str | None:
    with contextlib.suppress(OSError, ValueError):
        return str(json.loads((shard_dir / "status.json").read_text()).get("status"))
    return None


def _task_on(state: Path, node_id: str) -> Path | None:
    """The shard folder whose ``ray_task.json`` says it runs on ``node_id``."""
    for task_file in state.glob("*/shard_*/ray_task.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(task_file.read_text()).get("node_id") == node_id:
                return task_file.parent
    return None


def _kill_worker_mid_shard(
    spec: dict[str, Any],
    proc: subprocess.Popen[str],
    worker: subprocess.Popen[bytes],
    worker_id: str,
) -> dict[str, Any]:
    """Wait until the worker node's shard is sending, then SIGKILL the whole node."""
    state, log = Path(spec["state_dir"]), Path(spec["workdir"]) / "requests.log"
    deadline = time.monotonic() + 300
    shard_dir = None
    while _running(proc) and time.monotonic() < deadline:
        shard_dir = shard_dir or _task_on(state, worker_id)
        if (
            shard_dir is not None
            and _status(shard_dir) == "running"
            and _received(log) >= spec.get("kill_after_requests", 40)
        ):
            break
        time.sleep(0.05)
    time.sleep(random.Random(spec.get("seed", 7)).uniform(0.2, 1.0))
    killed = {"shard_dir": str(shard_dir), "received_before": _received(log)}
    killed["status_before"] = _status(shard_dir) if shard_dir else None
    # The whole node at once, as when a machine dies: its process group (raylet, agents) and
    # the worker running the shard, which Ray starts outside that group.
    task = json.loads((shard_dir / "ray_task.json").read_text()) if shard_dir else {}
    killed["time"] = time.time()
    os.killpg(worker.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, KeyError):
        os.kill(int(task["pid"]), signal.SIGKILL)
    worker.wait()
    return killed


def _terminate(proc: subprocess.Popen[str], log: Path, after: int) -> bool:
    """SIGTERM to ``mmirage run`` once the emulator has had ``after`` requests; whether it was
    still running then."""
    deadline = time.monotonic() + 300
    while _running(proc) and _received(log) < after and time.monotonic() < deadline:
        time.sleep(0.05)
    if not _running(proc):
        return False
    proc.send_signal(signal.SIGTERM)
    return True


def _run_command(
    spec: dict[str, Any],
    index: int,
    command: list[str] | dict[str, Any],
    env: dict[str, str],
    worker: subprocess.Popen[bytes],
    worker_id: str,
    result: dict[str, Any],
) -> dict[str, Any]:
    """``mmirage ARGS <config>.yaml`` (a list of ARGS: the config ``pipeline``); what it said,
    its exit status, the requests it sent and its own peak RSS (``wait4``)."""
    workdir = Path(spec["workdir"])
    log = workdir / "requests.log"
    if isinstance(command, list):
        command = {"args": command, "config": "pipeline"}
    out_path, err_path = workdir / f"out-{index}.txt", workdir / f"err-{index}.txt"
    before, began = _received(log), time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(
            [str(BIN / "mmirage"), *command["args"], str(workdir / f"{command['config']}.yaml")],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=err,
            text=True,
        )
        if index == 0 and spec.get("kill_worker"):
            result["killed"] = _kill_worker_mid_shard(spec, proc, worker, worker_id)
        if index == 0 and spec.get("terminate_after_requests"):
            result["terminated"] = _terminate(proc, log, spec["terminate_after_requests"])
        _, status, usage = os.wait4(proc.pid, 0)
    return {
        "args": command["args"],
        "returncode": os.waitstatus_to_exitcode(status),
        "stdout": out_path.read_text(),
        "stderr": err_path.read_text(),
        "seconds": time.monotonic() - began,
        "requests": _received(log) - before,
        "peak_rss_mb": usage.ru_maxrss / 1024,
    }


def _serve_bucket(
    s3: dict[str, Any], workdir: Path
) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """``moto_server`` with ``s3["bucket"]`` holding ``s3["upload"]`` (key: workdir file)."""
    moto, endpoint = s3_support.start_moto(workdir / "moto.log")
    s3_support.client(endpoint).create_bucket(Bucket=s3["bucket"])
    for key, name in s3.get("upload", {}).items():
        s3_support.client(endpoint).upload_file(str(workdir / name), s3["bucket"], key)
    return moto, s3_support.variables(endpoint)


def _read_back(s3: dict[str, Any], s3_env: dict[str, str], workdir: Path) -> list[str]:
    """The objects under ``s3["read_back"]``, copied to ``<workdir>/s3/<key>``; their keys."""
    endpoint = s3_env["MMI_S3_ENDPOINT"]
    return s3_support.download(endpoint, s3["bucket"], s3["read_back"], workdir / "s3")


def main(workdir: Path) -> None:
    spec = json.loads((workdir / "spec.json").read_text())
    log = workdir / "requests.log"
    temp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths have a limit
    # A token in ~/.ray/auth_token would turn on Ray's token authentication: this cluster
    # neither reads the machine's home nor leaves anything there.
    os.environ.update({"HOME": temp, "RAY_AUTH_MODE": "disabled"})
    started: list[subprocess.Popen[Any]] = []
    result: dict[str, Any] = {"commands": []}
    try:
        emulator, base_url = _start_emulator(log, spec.get("latency_s", 0.0))
        started.append(emulator)
        configs = spec.get("configs") or {"pipeline": spec["config"]}
        for name, text in configs.items():
            (workdir / f"{name}.yaml").write_text(text.replace("{base_url}", base_url))
        cpus = str(spec.get("cpus_per_node", 1))
        common = ["--num-cpus", cpus, "--temp-dir", temp]
        head = _ray_node(
            ["--head", "--port", str(HEAD_PORT), "--include-dashboard=false", *common],
            workdir / "head.log",
        )
        started.append(head)
        import ray

        _wait_for_nodes(ray, 1)
        worker = _ray_node(
            ["--address", f"127.0.0.1:{HEAD_PORT}", *common],
            workdir / "worker.log",
            spec.get("hide_on_worker"),
        )
        started.append(worker)
        nodes = _wait_for_nodes(ray, 2)
        worker_id = next(
            n["NodeID"] for n in nodes if "node:__internal_head__" not in n["Resources"]
        )
        result["worker_node_id"] = worker_id
        env = {
            **os.environ,
            "RAY_ADDRESS": f"127.0.0.1:{HEAD_PORT}",
            "OPENAI_API_KEY": KEY,
            "XDG_CACHE_HOME": str(workdir / "cache"),
        }
        if spec.get("s3"):  # a moto S3 server: its variables in the driver's environment only
            moto, s3_env = _serve_bucket(spec["s3"], workdir)
            started.insert(0, moto)  # stopped last: the objects are read back after the runs
            env.update(s3_env)
        for index, command in enumerate(spec["commands"]):
            result["commands"].append(
                _run_command(spec, index, command, env, worker, worker_id, result)
            )
        if spec.get("s3"):
            result["s3_keys"] = _read_back(spec["s3"], s3_env, workdir)
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        for proc in reversed(started):  # the nodes (whole process groups), then the emulator
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if os.getpgid(proc.pid) == proc.pid:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(10)
        result["files_with_key"] = _files_holding(Path(temp), KEY) + _files_holding(workdir, KEY)
        if spec.get("s3"):
            result["files_with_s3_secret"] = [
                path
                for secret in (s3_support.SECRET, s3_support.KEY_ID)
                for path in _files_holding(Path(temp), secret) + _files_holding(workdir, secret)
            ]
        shutil.rmtree(temp, ignore_errors=True)
        (workdir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
