"""Datasets and outputs on object storage (issue 32, item 3), against a real S3 endpoint: a
``moto_server`` on 127.0.0.1, the emulator, and the real ``mmirage`` CLI in subprocesses.

A dataset uploaded to ``s3://`` (JSONL, CSV) is read from there; each shard is published there
as one object that appears only when complete (a run killed mid-shard leaves none under its
name); ``merge`` and ``stats`` read the shards back from there; credentials come from
environment variables that ``storage_options`` names, and no file the run wrote holds them.
Skipped where moto, s3fs or boto3 is not installed (the dev extra lists them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import TEST_KEY
from mmirage.config import load_mmirage_config_dict
from mmirage.config.errors import ConfigError
from mmirage.rundir import fingerprint, pipeline_id
from mmirage.storage import mirror_dir
from provider_emulator import EmulatorConfig, running_emulator
from s3_support import KEY_ID, OPTIONS, SECRET, client, keys, missing, start_moto, variables

MMIRAGE = Path(sys.executable).with_name("mmirage")


def _need_moto() -> None:
    """Skip without moto, s3fs or boto3; in CI (``CI`` set), where they must run, fail."""
    message = missing()
    if message and os.environ.get("CI"):
        pytest.fail(message)
    if message:
        pytest.skip(message)


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1, on a port the OS picked (its log names it)."""
    _need_moto()
    server, endpoint = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    try:
        yield endpoint
    finally:
        server.terminate()
        server.wait()


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"mmirage-{uuid.uuid4().hex[:12]}"  # one bucket per test: safe in parallel
    client(s3_endpoint).create_bucket(Bucket=name)
    return name


def _object(endpoint: str, bucket: str, key: str) -> bytes:
    body: bytes = client(endpoint).get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def _jsonl(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def _config(
    root: Path, base_url: str, path: str | dict[str, str], output_dir: str, **loading: Any
) -> Path:
    config = {
        "processors": [{"type": "llm", "base_url": base_url, "model": "m"}],
        "loading_params": {
            "state_dir": str(root / "state"),
            "datasets": [
                {
                    "path": path,
                    "type": loading.pop("type", "JSONL"),
                    "output_dir": output_dir,
                    **({"storage_options": OPTIONS} if loading.pop("named", True) else {}),
                }
            ],
            "num_shards": 2,
            "batch_size": 4,
            "output_format": "jsonl",
            **loading,
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}, {"name": "text", "key": "text"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Say {{ text }}"}],
            "output_schema": {"id": "{{ id }}", "answer": "{{ answer }}"},
        },
    }
    path_ = root / "pipeline.yaml"
    path_.write_text(yaml.safe_dump(config))
    return path_


def _env(root: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {
        **env,
        **variables(endpoint),
        "XDG_CACHE_HOME": str(root / "cache"),
        "OPENAI_API_KEY": TEST_KEY,  # the emulator's
    }


def _command() -> list[str]:
    return [str(MMIRAGE)] if MMIRAGE.exists() else [sys.executable, "-m", "mmirage"]


def _mmirage(*args: str, root: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*_command(), *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def _no_secret_in_files(root: Path, *texts: str) -> None:
    """Neither secret value in any file under ``root`` (config, state, mirror), nor in the
    commands' output."""
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert SECRET.encode() not in data and KEY_ID.encode() not in data, path
    for text in texts:
        assert SECRET not in text and KEY_ID not in text


def test_a_jsonl_dataset_runs_from_s3_to_s3_then_merges_and_stats_from_there(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    rows = 10
    data = "".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(rows))
    client(s3_endpoint).put_object(Bucket=bucket, Key="in/data.jsonl", Body=data.encode())
    with running_emulator(EmulatorConfig(record_requests=True)) as emu:
        config = _config(
            tmp_path, emu.openai_base_url, f"s3://{bucket}/in/data.jsonl", f"s3://{bucket}/out"
        )
        env = _env(tmp_path, s3_endpoint)
        # DEBUG: the storage client's own debug lines would quote its Authorization header.
        run = _mmirage("run", str(config), "--log-level", "debug", root=tmp_path, env=env)
        assert run.returncode == 0, run.stderr
        asked = len(emu.requests())

    assert asked == rows  # one request per row: nothing paid twice
    assert keys(s3_endpoint, bucket, "out/") == [
        "out/shard-0-of-2.jsonl",
        "out/shard-1-of-2.jsonl",
    ]
    published = [
        row
        for k in range(2)
        for row in _jsonl(_object(s3_endpoint, bucket, f"out/shard-{k}-of-2.jsonl"))
    ]
    assert sorted(int(row["id"]) for row in published) == list(range(rows))
    assert all(row["answer"] for row in published)
    # Nothing was published on the local disk: the part files' folder holds no shard.
    mirror = mirror_dir(str(tmp_path / "state"), f"s3://{bucket}/out")
    assert not list(mirror.glob("shard-*"))

    merge = _mmirage("merge", str(config), "--format", "jsonl", root=tmp_path, env=env)
    assert merge.returncode == 0, merge.stderr
    assert f"s3://{bucket}/out/merged.jsonl" in merge.stdout
    merged = _jsonl(_object(s3_endpoint, bucket, "out/merged.jsonl"))
    assert [int(row["id"]) for row in merged] == list(range(rows))

    stats = _mmirage("stats", str(config), root=tmp_path, env=env)
    assert stats.returncode == 0, stats.stderr
    aggregate = json.loads(stats.stdout)["aggregate"]
    assert aggregate["published_shards"] == 2 and aggregate["total_rows"] == rows

    _no_secret_in_files(tmp_path, run.stdout, run.stderr, merge.stdout, merge.stderr, stats.stdout)
    for key in keys(s3_endpoint, bucket, "out/"):
        assert SECRET.encode() not in _object(s3_endpoint, bucket, key)


def test_a_csv_dataset_with_boto_s_own_variables_is_published_as_parquet_objects(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    rows = 7
    data = "id,text\n" + "".join(f'{i},"row, {i}"\n' for i in range(rows))
    client(s3_endpoint).put_object(Bucket=bucket, Key="in/data.csv", Body=data.encode())
    with running_emulator(EmulatorConfig()) as emu:
        config = _config(
            tmp_path,
            emu.openai_base_url,
            f"s3://{bucket}/in/data.csv",
            f"s3://{bucket}/out/",
            type="csv",
            output_format="parquet",
            named=False,  # no storage_options: the variables boto reads
        )
        env = _env(tmp_path, s3_endpoint)
        env.update(
            AWS_ENDPOINT_URL=s3_endpoint,
            AWS_ACCESS_KEY_ID=KEY_ID,
            AWS_SECRET_ACCESS_KEY=SECRET,
            AWS_DEFAULT_REGION="us-east-1",
        )
        for name in OPTIONS.values():
            del env[name]
        run = _mmirage("run", str(config), root=tmp_path, env=env)
    assert run.returncode == 0, run.stderr
    assert keys(s3_endpoint, bucket, "out/") == [
        "out/shard-0-of-2.parquet",
        "out/shard-1-of-2.parquet",
    ]
    merge = _mmirage("merge", str(config), "--format", "jsonl", root=tmp_path, env=env)
    assert merge.returncode == 0, merge.stderr
    merged = _jsonl(_object(s3_endpoint, bucket, "out/merged.jsonl"))
    assert [row["id"] for row in merged] == [str(i) for i in range(rows)]  # CSV values: text
    # An hf merge is a folder: its files are uploaded under <output_dir>/merged/.
    hf = _mmirage("merge", str(config), "--format", "hf", root=tmp_path, env=env)
    assert hf.returncode == 0, hf.stderr
    assert "out/merged/dataset_info.json" in keys(s3_endpoint, bucket, "out/merged/")
    _no_secret_in_files(tmp_path, run.stdout, run.stderr, merge.stdout, merge.stderr, hf.stderr)


def test_a_publish_stopped_before_its_upload_is_uploaded_without_computing_again(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    data = "".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(6))
    client(s3_endpoint).put_object(Bucket=bucket, Key="in/data.jsonl", Body=data.encode())
    with running_emulator(EmulatorConfig(record_requests=True)) as emu:
        config = _config(
            tmp_path, emu.openai_base_url, f"s3://{bucket}/in/data.jsonl", f"s3://{bucket}/out"
        )
        env = _env(tmp_path, s3_endpoint)
        assert _mmirage("run", str(config), root=tmp_path, env=env).returncode == 0
        # As if the run had stopped after its local publish: the shard is in the mirror, the
        # checkpoint says published, the object is not there.
        key = "out/shard-1-of-2.jsonl"
        mirror = mirror_dir(str(tmp_path / "state"), f"s3://{bucket}/out")
        (mirror / "shard-1-of-2.jsonl").write_bytes(_object(s3_endpoint, bucket, key))
        client(s3_endpoint).delete_object(Bucket=bucket, Key=key)
        emu.reset_stats()
        again = _mmirage("run", str(config), root=tmp_path, env=env)
        assert again.returncode == 0, again.stderr
        assert emu.requests() == []  # nothing computed (nor paid) again
        assert "shard 1/2: already done" in again.stderr  # uploaded, not run again
    assert not (mirror / "shard-1-of-2.jsonl").exists()
    assert key in keys(s3_endpoint, bucket, "out/")
    assert len(_jsonl(_object(s3_endpoint, bucket, key))) == 3


def test_a_run_killed_mid_shard_leaves_no_object_under_the_shard_name(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    rows = 40
    data = "".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(rows))
    client(s3_endpoint).put_object(Bucket=bucket, Key="in/data.jsonl", Body=data.encode())
    # Slow answers, one at a time: the shard is still running when it is killed.
    with running_emulator(EmulatorConfig(latency_s=0.2)) as emu:
        config = _config(
            tmp_path,
            emu.openai_base_url,
            f"s3://{bucket}/in/data.jsonl",
            f"s3://{bucket}/out",
            num_shards=1,
            batch_size=1,
        )
        text = yaml.safe_load(config.read_text())
        text["processors"][0]["worker_concurrency"] = 1
        config.write_text(yaml.safe_dump(text))
        env = _env(tmp_path, s3_endpoint)
        run = subprocess.Popen(
            [*_command(), "run", str(config)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        checkpoint = mirror_dir(str(tmp_path / "state"), f"s3://{bucket}/out")
        checkpoint = checkpoint / ".parts" / "shard-0-of-1.ckpt.json"
        try:
            while run.poll() is None and not _rows_done(checkpoint):
                time.sleep(0.05)  # until the shard has rows, not a time limit
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        assert 0 < _rows_done(checkpoint) < rows  # killed mid-shard
        assert keys(s3_endpoint, bucket, "out/") == []  # no partial object, under any name

        again = _mmirage("run", str(config), root=tmp_path, env=env)
    assert again.returncode == 0, again.stderr
    assert keys(s3_endpoint, bucket, "out/") == ["out/shard-0-of-1.jsonl"]
    published = _jsonl(_object(s3_endpoint, bucket, "out/shard-0-of-1.jsonl"))
    assert [int(row["id"]) for row in published] == list(range(rows))  # each row once


def _rows_done(checkpoint: Path) -> int:
    try:
        return int(json.loads(checkpoint.read_text())["rows_done"])
    except (OSError, ValueError, KeyError):
        return 0


def test_an_unset_credential_variable_is_one_sentence_naming_it(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    config = _config(tmp_path, "http://127.0.0.1:9/v1", f"s3://{bucket}/x.jsonl", "out")
    env = _env(tmp_path, s3_endpoint)
    del env["MMI_S3_SECRET"]
    run = _mmirage("run", str(config), root=tmp_path, env=env)
    assert run.returncode == 2
    assert "storage_options.secret names the environment variable MMI_S3_SECRET" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_missing_object_is_one_sentence_without_the_secret(
    tmp_path: Path, s3_endpoint: str, bucket: str
) -> None:
    url = f"s3://{bucket}/nothing-here.jsonl"
    config = _config(tmp_path, "http://127.0.0.1:9/v1", url, f"s3://{bucket}/out")
    run = _mmirage("run", str(config), root=tmp_path, env=_env(tmp_path, s3_endpoint))
    assert run.returncode == 2
    assert url in run.stderr and "no such object" in run.stderr
    _no_secret_in_files(tmp_path, run.stdout, run.stderr)


def test_without_s3fs_the_run_names_the_extra(tmp_path: Path) -> None:
    # s3fs made unimportable, as on an install without the s3 extra.
    shadow = tmp_path / "shadow" / "s3fs"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 's3fs'\", name='s3fs')\n"
    )
    config = _config(tmp_path, "http://127.0.0.1:9/v1", "s3://bucket/data.jsonl", "s3://b/out")
    env = _env(tmp_path, "http://127.0.0.1:9")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shadow.parent), env.get("PYTHONPATH")]))
    run = _mmirage("run", str(config), root=tmp_path, env=env)
    assert run.returncode == 2
    assert "mmirage[s3]" in run.stderr and "s3fs" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def _loaded(**dataset: Any) -> Any:
    return load_mmirage_config_dict(
        {
            "processors": [{"type": "llm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
            "loading_params": {
                "state_dir": "state",
                "output_format": dataset.pop("output_format", "jsonl"),
                "datasets": [{"path": "d.jsonl", "type": "JSONL", "output_dir": "out", **dataset}],
            },
            "processing_params": {
                "inputs": [{"name": "text", "key": "text"}],
                "outputs": [{"name": "a", "type": "llm", "prompt": "{{ text }}"}],
                "output_schema": {"a": "{{ a }}"},
            },
        }
    )


def test_a_secret_value_in_storage_options_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"storage_options\.secret.*name of an environment"):
        _loaded(storage_options={"secret": "wJalrXUtnFEMI/K7MDENG+bPxRfiCY"})


def test_an_hf_output_format_on_object_storage_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"output_format.*set output_format: jsonl or parquet"):
        _loaded(output_dir="s3://bucket/out", output_format="hf")


def test_storage_options_leave_the_fingerprint_and_pipeline_id_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain, named = _loaded(), _loaded(storage_options=OPTIONS)
    assert fingerprint(named) == fingerprint(plain)
    assert pipeline_id(named) == pipeline_id(plain)
    # A URL is its own identity, whatever the working directory.
    remote = _loaded(output_dir="s3://bucket/out")
    here = pipeline_id(remote)
    monkeypatch.chdir(tmp_path)
    assert pipeline_id(remote) == here


def test_a_local_dataset_never_imports_fsspec(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "a"}\n')
    code = (
        "import sys\n"
        "from mmirage.config.loading_params import DatasetConfig\n"
        "from mmirage.core.loader import open_dataset\n"
        f"ds = DatasetConfig(path={str(data)!r}, type='JSONL', output_dir='out')\n"
        "assert [r.data for r in open_dataset(ds).iter_rows()] == [{'text': 'a'}]\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 's3fs')"
        " or m == 'mmirage.storage.store'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
