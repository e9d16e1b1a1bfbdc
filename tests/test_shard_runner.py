"""run_shard end to end on JSONL in tmp_path with a fake processor; `mmirage run|check` as
subprocesses with a real custom processor."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mmirage.config import load_mmirage_config_dict
from mmirage.config.models import MMirageConfig
from mmirage.core.process.base import OutputRequest, OutputResult, Processor
from mmirage.core.shard import ShardConflictError, run_shard, shard_state
from mmirage.core.shard.state import atomic_write_json, read_status
from mmirage.rundir import RunDir

ROWS = 10
MISSING_TEXT = 4  # this row has no "text": a RowError for that row only


class FakeProcessor(Processor):
    """Echoes the prompt (JSON outputs: a dict); scripted row failures and a scripted crash."""

    def __init__(self, *, fail_keys: Sequence[str] = (), raise_on_call: int | None = None):
        self.calls: list[tuple[str, list[str]]] = []
        self.fail_keys = set(fail_keys)
        self.raise_on_call = raise_on_call

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        self.calls.append((output.name, [r.row_key for r in requests]))
        if self.raise_on_call == len(self.calls):
            raise RuntimeError("provider went away")
        results = []
        for r in requests:
            prompt = r.prompt or ""
            if r.row_key in self.fail_keys:
                results.append(OutputResult(error="scripted failure", input_tokens=1))
            elif output.is_json:
                value = {"score": len(prompt), "label": prompt.upper()}
                results.append(OutputResult(value=value, input_tokens=3, output_tokens=5))
            else:
                results.append(
                    OutputResult(value=f"echo:{prompt}", input_tokens=2, output_tokens=1)
                )
        return results

    async def aclose(self) -> None:
        raise AssertionError("run_shard must not close processors it was given")

    def keys(self) -> list[str]:
        return [key for _, keys in self.calls for key in keys]


def write_rows(path: Path, n: int = ROWS) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            row: dict[str, Any] = {"id": i, "text": f"t{i}", "n": i * 10}
            if i == MISSING_TEXT:
                del row["text"]
            f.write(json.dumps(row) + "\n")
    return path


def make_config(tmp_path: Path, *, num_shards: int = 1, batch_size: int = 3, **pp: Any) -> Any:
    data = {
        "processors": [{"type": "llm", "model": "m", "message_format": "local"}],
        "loading_params": {
            "datasets": [
                {
                    "path": str(tmp_path / "in.jsonl"),
                    "type": "JSONL",
                    "output_dir": str(tmp_path / "out"),
                }
            ],
            "num_shards": num_shards,
            "batch_size": batch_size,
            "output_format": "jsonl",
            "state_dir": str(tmp_path / "state"),
        },
        "processing_params": {
            "inputs": [
                {"name": "id", "key": "id"},
                {"name": "text", "key": "text"},
                {"name": "n", "key": "n"},
            ],
            "outputs": [
                {"name": "answer", "type": "llm", "prompt": "Q {{ text }}"},
                {
                    "name": "grade",
                    "type": "llm",
                    "prompt": "grade {{ answer }}",
                    "output_type": "JSON",
                    "output_schema": {"score": "int", "label": "str"},
                },
            ],
            "output_schema": {
                "answer": "{{ answer }}",
                "score": "{{ grade.score }}",
                "meta": {"n": "{{ n }}", "tag": "x-{{ id }}"},
            },
            **pp,
        },
    }
    if not (tmp_path / "in.jsonl").exists():
        write_rows(tmp_path / "in.jsonl")
    return load_mmirage_config_dict(data, source="test.yaml", env={})


ONE_OUTPUT: dict[str, Any] = {
    "outputs": [{"name": "answer", "type": "llm", "prompt": "Q {{ text }}"}],
    "output_schema": {"answer": "{{ answer }}"},
}


def published(config: MMirageConfig, shard: int = 0) -> list[dict[str, Any]]:
    n = config.loading_params.num_shards
    path = Path(config.loading_params.datasets[0].output_dir) / f"shard-{shard}-of-{n}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def procs(fake: FakeProcessor) -> dict[str, Processor]:
    return {"llm": fake}


def test_one_shard_end_to_end(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    fake = FakeProcessor(fail_keys=["0::7"])
    report = run_shard(config, 0, processors=procs(fake))

    rows = published(config)
    assert [r["__row_key__"] for r in rows] == [f"0::{i}" for i in range(ROWS)]
    good = rows[0]
    assert good["answer"] == "echo:Q t0"
    assert good["score"] == len("grade echo:Q t0") and isinstance(good["score"], int)
    assert good["meta"] == {"n": 0, "tag": "x-0"}  # bare {{ n }} keeps the int
    assert good["id"] == 0 and good["text"] == "t0"  # remove_columns false: source kept
    assert good["__errors__"] is None
    assert good["__usage__"] == {"input_tokens": 5, "output_tokens": 6}

    missing = rows[MISSING_TEXT]
    assert "'text'" in missing["__errors__"]["__row__"]
    assert missing["answer"] is None and missing["id"] == MISSING_TEXT
    assert missing["__usage__"] == {"input_tokens": 0, "output_tokens": 0}
    # Row 7 fails its first output: the second output is not requested for it.
    assert rows[7]["__errors__"] == {"answer": "scripted failure"}
    assert "0::7" not in dict(fake.calls[1:2]).get("grade", [])
    assert all(f"0::{MISSING_TEXT}" not in keys for _, keys in fake.calls)

    assert (report.rows_done, report.rows_failed) == (ROWS, 2)
    assert report.input_tokens == sum(r["__usage__"]["input_tokens"] for r in rows) == 8 * 5 + 1
    assert report.output_tokens == 8 * 6
    assert not (tmp_path / "out" / ".parts" / "shard-0-of-1.jsonl").exists()


def test_shards_cover_the_dataset_exactly_once(tmp_path: Path) -> None:
    config = make_config(tmp_path, num_shards=3)
    keys = []
    for k in range(3):
        run_shard(config, k, processors=procs(FakeProcessor()))
        keys += [r["__row_key__"] for r in published(config, k)]
    assert keys == [f"0::{i}" for i in range(ROWS)]  # contiguous shards, in order


def test_resume_after_interruption_never_resends_a_row(tmp_path: Path) -> None:
    config = make_config(tmp_path, batch_size=2, **ONE_OUTPUT)
    crashing = FakeProcessor(raise_on_call=3)  # one output: one call per batch
    with pytest.raises(RuntimeError, match="provider went away"):
        run_shard(config, 0, processors=procs(crashing))
    status = read_status(RunDir.of(config).status_path(0))
    assert status is not None
    assert status["status"] == "failed" and status["error"] == "RuntimeError: provider went away"
    assert status["rows_done"] == 4 and status["attempts"] == 1
    part = tmp_path / "out" / ".parts" / "shard-0-of-1.jsonl"
    with open(part, "ab") as f:
        f.write(b'{"torn": ')  # a half-written line past the checkpoint is dropped

    again = FakeProcessor()
    report = run_shard(config, 0, processors=procs(again))
    done_before = {f"0::{i}" for i in range(4)}
    assert not done_before & set(again.keys())
    assert report.resumed_rows == 4 and report.rows_done == ROWS

    (tmp_path / "fresh").mkdir()
    fresh = make_config(tmp_path / "fresh", batch_size=2, **ONE_OUTPUT)
    run_shard(fresh, 0, processors=procs(FakeProcessor()))
    assert published(config) == published(fresh)
    status = read_status(RunDir.of(config).status_path(0))
    assert status is not None and status["attempts"] == 2 and status["retry_count"] == 1


def test_a_finished_shard_is_skipped_unless_forced(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    run_shard(config, 0, processors=procs(FakeProcessor()))
    first = published(config)
    idle = FakeProcessor()
    report = run_shard(config, 0, processors=procs(idle))
    assert report.skipped and idle.calls == []
    assert report.rows_done == ROWS and report.output_tokens == 9 * 6
    forced = FakeProcessor()
    run_shard(config, 0, processors=procs(forced), force=True)
    # Computed again from the stored answers; --fresh asks again.
    assert forced.keys() == [] and published(config) == first
    fresh = FakeProcessor()
    run_shard(config, 0, processors=procs(fresh), fresh=True)
    assert len(fresh.keys()) > 0 and published(config) == first


def test_status_json(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    run_shard(config, 0, processors=procs(FakeProcessor(fail_keys=["0::1"])))
    path = RunDir.of(config).status_path(0)
    assert path.parent.name == "shard_0" and path.is_relative_to(tmp_path / "state")
    s = read_status(path)
    assert s is not None
    assert s["status"] == "success" and s["error"] is None and s["shard_id"] == 0
    assert s["num_shards"] == 1 and s["attempts"] == 1 and s["retry_count"] == 0
    assert (s["rows_done"], s["rows_failed"]) == (ROWS, 2)
    assert s["input_tokens"] == 8 * 5 + 1 and s["output_tokens"] == 8 * 6
    assert s["datasets"] == [{"output_dir": str(tmp_path / "out"), "image_base_path": None}]
    for key in ("started_at", "finished_at", "heartbeat", "hostname", "pid", "fingerprint"):
        assert s[key]
    assert s["stats"]["rows_processed"] == ROWS
    assert shard_state(s, max_retries=3) == "success"


def test_stale_running_and_exhausted_states(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    path = RunDir.of(config).status_path(0)
    old = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    live = {"status": "running", "heartbeat": datetime.now(UTC).isoformat(), "pid": os.getpid()}
    assert shard_state({"status": "running", "heartbeat": old}, 3) == "stale"
    assert shard_state(live, 3) == "running"
    assert shard_state({"status": "failed", "attempts": 3}, 3) == "failed"
    assert shard_state({"status": "failed", "attempts": 4}, 3) == "exhausted"  # 3 retries used
    assert shard_state(None, 3) == "missing"

    atomic_write_json(path, {**live, "hostname": "elsewhere"})
    with pytest.raises(ShardConflictError, match="is running"):
        run_shard(config, 0, processors=procs(FakeProcessor()))
    atomic_write_json(path, {"status": "running", "heartbeat": old, "attempts": 1})
    run_shard(config, 0, processors=procs(FakeProcessor()))  # a dead shard may be retried
    assert (read_status(path) or {})["status"] == "success"


class StoringFake(FakeProcessor):
    """A fake whose answers the runner stores: its requests are shaped by ``model``."""

    def __init__(self, model: str = "m", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model

    def request_identity(self, output: Any) -> Any:
        return {"model": self.model, "output": output.name}


def asked(fake: FakeProcessor, output: str) -> list[str]:
    return [key for name, keys in fake.calls if name == output for key in keys]


def test_a_changed_schema_is_computed_again_from_stored_answers(tmp_path: Path) -> None:
    run_shard(make_config(tmp_path), 0, processors=procs(StoringFake()))
    changed = make_config(tmp_path, output_schema={"answer": "{{ answer }}!"})
    again = StoringFake()
    report = run_shard(changed, 0, processors=procs(again))
    assert again.calls == []  # every answer came from the store
    rows = published(changed)
    assert rows[0]["answer"] == "echo:Q t0!" and "score" not in rows[0]
    assert report.notes == ["18 answer(s) reused from the answer store, 0 request(s) sent"]
    # Published anew under the new configuration: a third run skips it.
    assert run_shard(changed, 0, processors=procs(StoringFake())).skipped


def test_an_edited_prompt_asks_again_for_that_output_only(tmp_path: Path) -> None:
    run_shard(make_config(tmp_path), 0, processors=procs(StoringFake()))
    edited = make_config(tmp_path)
    edited.processing_params.outputs[1].prompt = "grade it: {{ answer }}"
    again = StoringFake()
    run_shard(edited, 0, processors=procs(again))
    assert asked(again, "answer") == []
    assert sorted(asked(again, "grade")) == sorted(f"0::{i}" for i in range(ROWS) if i != 4)


def test_pacing_leaves_a_finished_shard_alone_and_a_new_model_asks_again(
    tmp_path: Path,
) -> None:
    run_shard(make_config(tmp_path), 0, processors=procs(StoringFake()))
    paced = make_config(tmp_path)
    paced.processors[0].rpm = 60  # how fast, not what: the finished shard stays finished
    paced.processors[0].worker_concurrency = 3
    assert run_shard(paced, 0, processors=procs(StoringFake())).skipped
    other_model = make_config(tmp_path)
    other_model.processors[0].model = "another-model"
    again = StoringFake("another-model")
    run_shard(other_model, 0, processors=procs(again))
    assert len(asked(again, "answer")) == ROWS - 1  # the row without text is never asked


def test_a_fresh_run_asks_every_request_again(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    run_shard(config, 0, processors=procs(StoringFake()))
    assert run_shard(config, 0, processors=procs(again := StoringFake()), force=True)
    assert again.calls == []  # --recompute: from the store
    run_shard(config, 0, processors=procs(fresh := StoringFake()), fresh=True)
    assert len(asked(fresh, "answer")) == ROWS - 1


def test_a_paid_failure_that_would_come_back_the_same_is_not_bought_twice(
    tmp_path: Path,
) -> None:
    class Truncating(StoringFake):
        async def process(
            self, output: Any, requests: Sequence[OutputRequest]
        ) -> list[OutputResult]:
            results = await super().process(output, requests)
            for request, result in zip(requests, results, strict=True):
                if request.row_key == "0::7" and output.name == "answer":
                    result.value, result.error, result.kind = None, "cut", "truncated"
                if request.row_key == "0::8" and output.name == "answer":
                    result.value, result.error, result.retryable = None, "429", True
            return results

    config = make_config(tmp_path)
    run_shard(config, 0, processors=procs(Truncating()))
    again = Truncating()
    run_shard(
        make_config(tmp_path, output_schema={"a": "{{ answer }}"}), 0, processors=procs(again)
    )
    assert asked(again, "answer") == ["0::8"]  # the transient failure only
    errors = {row["__row_key__"]: row["__errors__"] for row in published(config)}
    assert errors["0::7"] == {"answer": "cut"}


# -- the CLI, with the real custom processor --------------------------------------------------


def mmirage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mmirage", *args], capture_output=True, text=True, timeout=120
    )


def cli_config(tmp_path: Path, **loading: Any) -> Path:
    write_rows(tmp_path / "in.jsonl")
    (tmp_path / "fn.py").write_text("def shout(variables):\n    return variables['text'].upper()\n")
    config = {
        "processors": [
            {"type": "custom", "script_path": str(tmp_path / "fn.py"), "function_name": "shout"}
        ],
        "loading_params": {
            "datasets": [
                {
                    "path": str(tmp_path / "in.jsonl"),
                    "type": "JSONL",
                    "output_dir": str(tmp_path / "out"),
                }
            ],
            "num_shards": 2,
            "batch_size": 4,
            "output_format": "jsonl",
            "state_dir": str(tmp_path / "state"),
            **loading,
        },
        "processing_params": {
            "inputs": [{"name": "text", "key": "text", "optional": True}],
            "outputs": [{"name": "loud", "type": "custom"}],
            "output_schema": {"loud": "{{ loud }}"},
            "remove_columns": True,
        },
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def test_cli_run_and_check(tmp_path: Path) -> None:
    config = cli_config(tmp_path)
    before = mmirage("check", str(config))
    assert before.returncode == 1 and "2 missing" in before.stdout

    ran = mmirage("run", str(config), "--stats")
    # Every shard finished, but one row failed: work failed (exit 1), named in one sentence.
    assert ran.returncode == 1, ran.stderr
    assert "error: 1 row(s) failed (first: row 0::4 (loud)" in ran.stderr
    assert "shard 0/2: done" in ran.stderr and "shard 1/2: done" in ran.stderr
    assert json.loads(ran.stdout)["aggregate"]["total_rows_done"] == ROWS
    rows = [
        json.loads(line)
        for k in range(2)
        for line in (tmp_path / "out" / f"shard-{k}-of-2.jsonl").read_text().splitlines()
    ]
    assert [r["loud"] for r in rows[:2]] == ["T0", "T1"] and len(rows) == ROWS
    # The optional input is None for that row: the function raises, the row records it.
    assert rows[MISSING_TEXT]["__errors__"] and rows[MISSING_TEXT]["loud"] is None

    checked = mmirage("check", str(config))
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.count("success") >= 2 and "2 shard(s): 2 success" in checked.stdout

    again = mmirage("run", str(config), "--shard-id", "1")
    assert again.returncode == 0 and "shard 1/2: already done" in again.stderr
    assert "shard 0/2" not in again.stderr


def test_cli_user_errors_exit_2(tmp_path: Path) -> None:
    missing = mmirage("run", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: ") and len(missing.stderr.splitlines()) == 1
    config = cli_config(tmp_path)
    out_of_range = mmirage("run", str(config), "--shard-id", "5")
    assert out_of_range.returncode == 2 and "num_shards is 2" in out_of_range.stderr
    (tmp_path / "in.jsonl").unlink()
    no_data = mmirage("run", str(config))
    assert no_data.returncode == 2 and "no such file" in no_data.stderr
    assert "Traceback" not in no_data.stderr


# The retried shard finishes, so the run ends on its one bad row (MISSING_TEXT), not the crash.
@pytest.mark.parametrize(
    ("max_retries", "message", "attempts"),
    [(1, "1 row(s) failed", 2), (0, "1 of 1 shard(s) did not succeed", 1)],
)
def test_cli_retries_exactly_max_retries(
    tmp_path: Path, max_retries: int, message: str, attempts: int
) -> None:
    from mmirage.cli.errors import exit_code_for
    from mmirage.errors import MmirageError
    from mmirage.executors.base import RunPlan, RunRequest
    from mmirage.executors.local import LocalExecutor

    config = make_config(tmp_path, **ONE_OUTPUT)
    fake = FakeProcessor(raise_on_call=1)  # the first attempt dies, a retry would succeed

    config.execution_params.retry = True
    config.execution_params.max_retries = max_retries

    def with_fake(cfg: Any, k: int, **kwargs: Any) -> Any:
        return run_shard(cfg, k, processors=procs(fake), **kwargs)

    # What `mmirage run` does with this config, the shard runner given the fake processor.
    executor = LocalExecutor(
        config, tmp_path / "ignored.yaml", "r1", run_shard=with_fake, handle_signals=False
    )
    result = executor.run(RunRequest(None, RunPlan(retry=True)))
    with pytest.raises(MmirageError, match=re.escape(message)) as err:
        result.conclude()
    assert exit_code_for(err.value) == 1
    assert (read_status(RunDir.of(config).status_path(0)) or {})["attempts"] == attempts


def test_a_shard_already_being_run_is_refused(tmp_path: Path) -> None:
    from mmirage.core.shard.state import shard_lock

    config = make_config(tmp_path)
    fake = FakeProcessor()
    held = shard_lock(RunDir.of(config).shard_lock_path(0), 0)  # another run holds it
    with held, pytest.raises(ShardConflictError, match="being run by another process"):
        run_shard(config, 0, processors=procs(fake))
    assert fake.calls == []  # nothing was paid for twice
    run_shard(config, 0, processors=procs(fake))  # released: the shard runs
    assert len(published(config)) == ROWS


def test_two_datasets_cannot_share_an_output_dir(tmp_path: Path) -> None:
    from mmirage.config import ConfigError

    data = write_rows(tmp_path / "a.jsonl")
    raw = {
        "processors": [{"type": "custom", "script_path": str(data), "function_name": "f"}],
        "loading_params": {
            "datasets": [
                {"type": "JSONL", "path": str(data), "output_dir": str(tmp_path / "out")},
                {"type": "JSONL", "path": str(data), "output_dir": str(tmp_path / "out") + "/"},
            ]
        },
        "processing_params": {
            "inputs": [],
            "outputs": [{"name": "o", "type": "custom"}],
            "output_schema": {"o": "{{ o }}"},
        },
    }
    with pytest.raises(ConfigError, match=r"datasets\[1\]\.output_dir: is also the output_dir"):
        load_mmirage_config_dict(raw)


def test_a_failed_output_nulls_only_the_fields_that_read_it(tmp_path: Path) -> None:
    config = make_config(tmp_path, remove_columns=True)
    fake = FakeProcessor(fail_keys=["0::7"])
    run_shard(config, 0, processors=procs(fake))
    row = published(config)[7]
    assert row["__errors__"] == {"answer": "scripted failure"}
    # answer failed and grade (after it) was not computed: their fields are null...
    assert row["answer"] is None and row["score"] is None
    # ...the fields that only read inputs render as in a good row.
    assert row["meta"] == {"n": 70, "tag": "x-7"}


def interrupted_after_four_rows(config: MMirageConfig) -> Path:
    """A run killed after checkpointing rows 0-3; returns the checkpoint's path."""
    with pytest.raises(RuntimeError, match="provider went away"):
        run_shard(config, 0, processors=procs(FakeProcessor(raise_on_call=3)))
    return Path(config.loading_params.datasets[0].output_dir) / ".parts" / "shard-0-of-1.ckpt.json"


def fresh_rows(tmp_path: Path) -> list[dict[str, Any]]:
    (tmp_path / "fresh").mkdir(exist_ok=True)
    fresh = make_config(tmp_path / "fresh", batch_size=2, **ONE_OUTPUT)
    run_shard(fresh, 0, processors=procs(FakeProcessor()))
    return published(fresh)


def test_an_unreadable_checkpoint_is_rebuilt_from_the_part_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(tmp_path, batch_size=2, **ONE_OUTPUT)
    ckpt = interrupted_after_four_rows(config)
    ckpt.write_bytes(b'{"rows_done": 4, "off')  # torn by a crash
    again = FakeProcessor()
    with caplog.at_level("WARNING"):
        run_shard(config, 0, processors=procs(again))
    assert not {f"0::{i}" for i in range(4)} & set(again.keys())  # nothing paid twice
    assert any(str(ckpt) in r.getMessage() for r in caplog.records)
    assert published(config) == fresh_rows(tmp_path)


def test_a_checkpoint_offset_inside_a_line_never_publishes_a_torn_line(tmp_path: Path) -> None:
    config = make_config(tmp_path, batch_size=2, **ONE_OUTPUT)
    ckpt = interrupted_after_four_rows(config)
    saved = json.loads(ckpt.read_text())
    saved["offset"] -= 7
    ckpt.write_text(json.dumps(saved))
    run_shard(config, 0, processors=procs(FakeProcessor()))
    assert published(config) == fresh_rows(tmp_path)  # every line whole, every row once


def test_a_truncated_published_shard_is_refused_then_repaired_without_paying_twice(
    tmp_path: Path,
) -> None:
    from mmirage.core.shard.published import ShardDamagedError

    config = make_config(tmp_path, batch_size=2, **ONE_OUTPUT)
    run_shard(config, 0, processors=procs(FakeProcessor()))
    shard = Path(config.loading_params.datasets[0].output_dir) / "shard-0-of-1.jsonl"
    lines = shard.read_bytes().splitlines(keepends=True)
    shard.write_bytes(b"".join(lines[:6]) + lines[6][:9])  # 6 rows and a torn 7th
    with pytest.raises(ShardDamagedError, match=f"{shard}.*--force-retry"):
        run_shard(config, 0, processors=procs(FakeProcessor()))
    again = FakeProcessor()
    report = run_shard(config, 0, processors=procs(again), reset_attempts=True)
    assert again.keys() == []  # the lost rows' answers come from the answer store
    assert report.rows_done == ROWS
    assert published(config) == fresh_rows(tmp_path)
    assert run_shard(config, 0, processors=procs(FakeProcessor())).skipped


def test_cli_run_check_and_merge_name_a_truncated_shard(tmp_path: Path) -> None:
    config = cli_config(tmp_path)
    mmirage("run", str(config))
    shard = tmp_path / "out" / "shard-1-of-2.jsonl"
    whole = shard.read_bytes()
    shard.write_bytes(b"".join(whole.splitlines(keepends=True)[:2]))  # 2 of its 5 rows

    for argv in (["run"], ["check"], ["merge"]):
        result = mmirage(*argv, str(config))
        assert result.returncode == 1, (argv, result.stdout, result.stderr)
        said = result.stdout + result.stderr
        assert f"published shard {shard} holds" in said and "--force-retry" in said, argv
    assert not (tmp_path / "out" / "merged").exists()

    repaired = mmirage("run", str(config), "--force-retry")
    assert "shard 1/2: done" in repaired.stderr and "resumed after 2" in repaired.stderr
    assert shard.read_bytes() == whole
    assert mmirage("check", str(config)).returncode == 0
    merged = mmirage("merge", str(config))
    assert merged.returncode == 0, merged.stderr


class PlainIterator(Processor):
    """A processor whose ``stream`` is an async iterator, not a generator (no ``aclose``)."""

    def stream(self, output: Any, requests: Sequence[OutputRequest]) -> Any:
        pairs = iter([(i, OutputResult(value=f"it:{r.prompt}")) for i, r in enumerate(requests)])

        class Pairs:
            def __aiter__(self) -> Pairs:
                return self

            async def __anext__(self) -> tuple[int, OutputResult]:
                try:
                    return next(pairs)
                except StopIteration:
                    raise StopAsyncIteration from None

        return Pairs()

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        raise AssertionError("streamed")


def test_a_processor_may_stream_through_any_async_iterator(tmp_path: Path) -> None:
    config = make_config(tmp_path, **ONE_OUTPUT)
    run_shard(config, 0, processors={"llm": PlainIterator()})
    rows = published(config)
    assert [r["answer"] for r in rows][:2] == ["it:Q t0", "it:Q t1"]


class SourceIndexes(FakeProcessor):
    """Also notes each request's source_index."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: dict[str, int] = {}

    async def process(self, output: Any, requests: Sequence[OutputRequest]) -> list[OutputResult]:
        self.sources.update((r.row_key, r.source_index) for r in requests)
        return await super().process(output, requests)


def test_a_group_across_splits_keys_each_row_by_its_own_split(tmp_path: Path) -> None:
    # One group holds the end of one split and the start of the next: each row keeps its
    # split's key and its global source_index (the split's offset plus its row id).
    paths = {}
    for split, n in (("train", 4), ("test", 3)):
        paths[split] = str(write_rows(tmp_path / f"{split}.jsonl", n))
    data = {
        "processors": [{"type": "llm", "model": "m", "message_format": "local"}],
        "loading_params": {
            "datasets": [{"path": paths, "type": "JSONL", "output_dir": str(tmp_path / "out")}],
            "batch_size": 5,
            "output_format": "jsonl",
            "state_dir": str(tmp_path / "state"),
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Q {{ id }}"}],
            "output_schema": {"answer": "{{ answer }}"},
        },
    }
    config = load_mmirage_config_dict(data, source="test.yaml", env={})
    proc = SourceIndexes()
    run_shard(config, 0, processors={"llm": proc})
    rows = published(config)
    keys = [f"0:train:{i}" for i in range(4)] + [f"0:test:{i}" for i in range(3)]
    assert [row["__row_key__"] for row in rows] == keys
    assert [row["answer"] for row in rows] == [f"echo:Q {i}" for i in (0, 1, 2, 3, 0, 1, 2)]
    assert [row["__usage__"] for row in rows] == [{"input_tokens": 2, "output_tokens": 1}] * 7
    assert all(row["__errors__"] is None for row in rows)
    assert proc.sources == {key: at for at, key in enumerate(keys)}
