"""The batch collector end to end over real HTTP to the emulator: run_shard submits, merge brings
the results home (complete, ordered, rebuilt like a live run), retry resubmits exactly what did
not succeed; plus the results store's rules and the row rebuild, unit by unit."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from mmirage.config import load_mmirage_config_dict
from mmirage.config.models import MMirageConfig
from mmirage.core.merge.merged_output import write_merged
from mmirage.core.merge.row_rebuild import MergeTotals, RowBuilder
from mmirage.core.process.batch.collector import (
    open_store,
    receipt_files,
    scan_receipts,
)
from mmirage.core.process.batch.resubmit import retry_failed
from mmirage.core.process.batch.results_store import (
    CANCELED,
    EXPIRED,
    FAILED,
    MISSING,
    RUNNING,
    SUCCEEDED,
    BatchRecord,
    Outcome,
    ResultsStore,
)
from mmirage.core.shard.runner import run_shard
from mmirage.rundir import RunDir
from provider_emulator import EmulatorConfig, running_emulator

KEY = "sk-collector-secret-4242"
ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
MODEL = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
SIZES = {"a": 12, "b": 9}  # two datasets
BROKEN = "a5"  # this row has no question: it fails at run time and must be kept as it is
NOT_SETTLED = (FAILED, EXPIRED, CANCELED, MISSING, RUNNING, "invalid")


# -- helpers (test_batch_cli imports them) -----------------------------------------------------


def write_dataset(tmp_path: Path, name: str, rows: int) -> dict[str, Any]:
    """Every third row has a local image (a multimodal request), one row lacks its input."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    image = tmp_path / "pixel.png"
    image.write_bytes(PNG)
    path = tmp_path / f"{name}.jsonl"
    with open(path, "w") as f:
        for i in range(rows):
            row: dict[str, Any] = {"id": f"{name}{i}", "q": f"question {name} {i}"}
            if i % 3 == 0:
                row["img"] = str(image)
            if row["id"] == BROKEN:
                del row["q"]
            f.write(json.dumps(row) + "\n")
    return {
        "path": str(path),
        "type": "JSONL",
        "output_dir": str(tmp_path / f"out-{name}"),
        "image_base_path": str(tmp_path),
    }


def processor_block(emu: Any, provider: str, **fields: Any) -> dict[str, Any]:
    base_url = emu.openai_base_url if provider == "openai" else emu.anthropic_base_url
    return {
        "type": "batch_api",
        "provider": provider,
        "model": MODEL[provider],
        "base_url": base_url,
        "max_requests_per_chunk": 5,
        **fields,
    }


def make_config(
    tmp_path: Path, emu: Any, provider: str = "openai", **options: Any
) -> MMirageConfig:
    data = config_data(tmp_path, emu, provider, **options)
    return load_mmirage_config_dict(data, source="batch-test.yaml", env={})


def config_data(
    tmp_path: Path,
    emu: Any,
    provider: str = "openai",
    *,
    output_format: str = "jsonl",
    processor: dict[str, Any] | None = None,
    num_shards: int = 2,
    kind: str = "batch_api",
    poll_interval: float = 30,
) -> dict[str, Any]:
    """2 datasets × ``num_shards`` shards × 2 outputs (plain and JSON), text and images."""
    return {
        "processors": [processor or processor_block(emu, provider)],
        "loading_params": {
            "datasets": [write_dataset(tmp_path, n, rows) for n, rows in SIZES.items()],
            "num_shards": num_shards,
            "batch_size": 4,
            "state_dir": str(tmp_path / "state"),
            "output_format": output_format,
        },
        "processing_params": {
            "inputs": [
                {"name": "question", "key": "q"},
                {"name": "image", "key": "img", "type": "image", "optional": True},
            ],
            "outputs": [
                {"name": "answer", "type": kind, "prompt": "Answer: {{ question }}"},
                {
                    "name": "facts",
                    "type": kind,
                    "prompt": "Facts about: {{ question }}",
                    "output_type": "JSON",
                    "output_schema": {"label": "str", "score": "int"},
                },
            ],
            "output_schema": {
                "question": "{{ question }}",
                "answer": "{{ answer }}",
                "label": "{{ facts.label }}",
                "facts": "{{ facts }}",
                "summary": "{{ question }} -> {{ answer }}",
            },
        },
        "execution_params": {"poll_interval_seconds": poll_interval},
    }


def run_all(config: MMirageConfig) -> None:
    for shard in range(config.loading_params.num_shards):
        run_shard(config, shard)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def source_keys() -> list[str]:
    """Every row key in source order: dataset 0 then dataset 1, rows in file order."""
    return [f"{d}::{i}" for d, rows in enumerate(SIZES.values()) for i in range(rows)]


def merge(config: MMirageConfig, output: Path, paths: tuple[str, ...] = ()) -> MergeTotals:
    """What ``batch_merge`` does, returning the totals instead of printing them."""
    from mmirage.core.process.batch.collector import AdapterPool
    from mmirage.core.process.batch.fetching import fetch_terminal

    with open_store(RunDir.of(config)) as store:
        scan = scan_receipts(receipt_files(RunDir.of(config), paths), store)
        fetch_terminal(store, AdapterPool(config), scan.records)
        return write_merged(config, RunDir.of(config), store, output)


def settled(totals: MergeTotals) -> bool:
    return not any(totals.requests[state] for state in NOT_SETTLED)


def receipt_ids(config: MMirageConfig) -> list[str]:
    return [cid for r in scan_lines(config) for cid in r.get("custom_id_to_source_index", {})]


def scan_lines(config: MMirageConfig) -> list[dict[str, Any]]:
    """The lines of the receipt files (not of the chunk markers that back them up)."""
    return [
        orjson.loads(line)
        for p in receipt_files(RunDir.of(config))
        if not p.endswith(".done")
        for line in Path(p).read_bytes().splitlines()
    ]


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ENV.values():
        monkeypatch.setenv(var, KEY)


@pytest.fixture(scope="module")
def emu() -> Iterator[Any]:
    with running_emulator(EmulatorConfig(seed=7)) as handle:
        yield handle


# -- end to end -------------------------------------------------------------------------------


def check_merged(rows: list[dict[str, Any]], provider: str) -> None:
    assert [r["__row_key__"] for r in rows] == source_keys()  # complete and in source order
    for row in rows:
        if row["id"] == BROKEN:  # failed at run time: kept as it was, nothing was sent
            assert set(row["__errors__"]) == {"__row__"}
            assert row["answer"] is None and "input_tokens" not in row
            continue
        assert row["__errors__"] is None, row
        assert row["answer"] == f"echo: Answer: {row['q']}"
        assert row["summary"] == f"{row['q']} -> {row['answer']}"
        assert isinstance(row["facts"], dict) and isinstance(row["facts"]["score"], int)
        assert row["label"] == row["facts"]["label"]
        assert "__vars__" not in row
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0
        assert "__usage__" not in row  # the tokens once, as the flat columns the spec names


@pytest.mark.parametrize(
    ("provider", "output_format"),
    [("openai", "jsonl"), ("openai", "hf"), ("anthropic", "jsonl"), ("gemini", "parquet")],
)
def test_submit_then_merge_rebuilds_the_dataset(
    emu: Any, keys: None, tmp_path: Path, provider: str, output_format: str
) -> None:
    config = make_config(tmp_path, emu, provider, output_format=output_format)
    run_all(config)
    ids = receipt_ids(config)
    assert len(ids) == len(set(ids)) == 2 * (sum(SIZES.values()) - 1)  # unique over everything
    assert {cid.split("-")[1] for cid in ids} == {"text", "multimodal"}

    totals = merge(config, tmp_path / "merged.jsonl")
    assert totals.requests[SUCCEEDED] == len(ids) and settled(totals)
    rows = read_jsonl(tmp_path / "merged.jsonl")
    check_merged(rows, provider)
    assert totals.rows == len(rows) and totals.rows_with_errors == 1
    assert totals.input_tokens == sum(r.get("input_tokens", 0) for r in rows)


def test_merged_rows_equal_a_live_llm_run(
    emu: Any, keys: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = make_config(tmp_path / "batch", emu)
    run_all(batch)
    merge(batch, tmp_path / "merged.jsonl")

    live_dir = tmp_path / "live"
    live = make_config(
        live_dir,
        emu,
        processor={
            "type": "llm",
            "model": MODEL["openai"],
            "base_url": emu.openai_base_url,
            "message_format": "openai",
        },
        kind="llm",
    )
    run_all(live)

    def comparable(row: dict[str, Any]) -> dict[str, Any]:
        skip = {"__usage__", "input_tokens", "output_tokens", "img", "__errors__"}
        return {k: v for k, v in row.items() if k not in skip}

    merged = read_jsonl(tmp_path / "merged.jsonl")
    live_rows = [
        row
        for ds in live.loading_params.datasets
        for k in range(2)
        for row in read_jsonl(Path(ds.output_dir) / f"shard-{k}-of-2.jsonl")
    ]
    assert [comparable(r) for r in merged] == [comparable(r) for r in live_rows]
    assert [bool(r["__errors__"]) for r in merged] == [bool(r["__errors__"]) for r in live_rows]


def test_rerun_after_success_submits_nothing(emu: Any, keys: None, tmp_path: Path) -> None:
    config = make_config(tmp_path, emu)
    run_all(config)
    merge(config, tmp_path / "merged.jsonl")
    before = emu.stats()["batches"]
    receipts = scan_lines(config)
    run_all(config)
    assert emu.stats()["batches"] == before
    assert scan_lines(config) == receipts


def test_a_terminal_batch_is_downloaded_once(
    emu: Any, keys: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmirage.core.process.batch.adapters.openai import OpenAIBatchAdapter

    config = make_config(tmp_path, emu)
    run_all(config)
    calls: list[str] = []
    original = OpenAIBatchAdapter.retrieve_results

    def counting(self: Any, batch_id: str, pc: Any) -> Any:
        calls.append(batch_id)
        return original(self, batch_id, pc)

    monkeypatch.setattr(OpenAIBatchAdapter, "retrieve_results", counting)
    merge(config, tmp_path / "one.jsonl")
    batches = {r["provider_batch_id"] for r in scan_lines(config)}
    assert sorted(calls) == sorted(batches)
    merge(config, tmp_path / "two.jsonl")
    assert len(calls) == len(batches)  # nothing downloaded again
    assert (tmp_path / "one.jsonl").read_bytes() == (tmp_path / "two.jsonl").read_bytes()
    assert RunDir.of(config).results_store.is_file()


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
def test_faults_are_reported_then_retry_completes_them(
    keys: None, tmp_path: Path, provider: str
) -> None:
    faults = EmulatorConfig(
        seed=3, batch_item_error_rate=0.15, batch_expire_rate=0.2, batch_failure_rate=0.2
    )
    with running_emulator(faults) as emu:
        config = make_config(tmp_path, emu, provider)
        run_all(config)
        first = merge(config, tmp_path / "merged.jsonl")
        assert first.requests[FAILED] and first.requests[EXPIRED], first.requests
        assert first.requests[RUNNING] == 0
        with ResultsStore(RunDir.of(config).results_store) as store:
            words = [(b.status, (b.provider_status or "").lower()) for b in store.batches()]
        if provider == "openai":  # Anthropic ends such batches, reporting each request
            assert ("failed", "expired") in words and ("failed", "failed") in words
        rows = read_jsonl(tmp_path / "merged.jsonl")
        assert [r["__row_key__"] for r in rows] == source_keys()  # nothing dropped
        bad = [r for r in rows if r["__errors__"] and r["id"] != BROKEN]
        assert bad
        for r in bad:  # only the fields that read a failed output are null
            assert r["question"] == f"question {r['id'][0]} {r['id'][1:]}", r
            for name in ("answer", "facts"):
                assert (r[name] is None) == (name in r["__errors__"]), r
        reasons = {v.split(":")[0] for r in bad for v in r["__errors__"].values()}
        assert {"failed", "expired"} <= reasons
        totals = first
        for _ in range(10):
            unsettled = sum(totals.requests[s] for s in (FAILED, EXPIRED, CANCELED, MISSING))
            report = retry_failed(config, RunDir.of(config))
            assert report.resubmitted == unsettled  # exactly the ones that did not succeed
            totals = merge(config, tmp_path / "merged.jsonl")
            if settled(totals):
                break
        assert settled(totals), totals.requests
        check_merged(read_jsonl(tmp_path / "merged.jsonl"), provider)
        # Nothing that succeeded the first time was ever sent again.
        first_ok = _succeeded_ids(config, rows)
        retried = [
            cid
            for r in scan_lines(config)
            if r.get("retry_of")
            for cid in r["custom_id_to_source_index"]
        ]
        assert first_ok and retried and not first_ok & set(retried)
        assert retry_failed(config, RunDir.of(config)).resubmitted == 0


def _succeeded_ids(config: MMirageConfig, rows: list[dict[str, Any]]) -> set[str]:
    """The custom ids of the rows that were complete after the first merge."""
    by_index = {
        cid: idx for r in scan_lines(config) for cid, idx in r["custom_id_to_source_index"].items()
    }
    keys = source_keys()
    complete = {keys.index(r["__row_key__"]) for r in rows if not r["__errors__"]}
    return {cid for cid, idx in by_index.items() if idx in complete}


def test_only_retryable_leaves_final_failures(keys: None, tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(seed=5, batch_item_error_rate=0.5)) as emu:
        config = make_config(tmp_path, emu)
        run_all(config)
        merge(config, tmp_path / "merged.jsonl")
        with ResultsStore(RunDir.of(config).results_store) as store:
            failures = list(store.failed_requests())
            retryable = list(store.failed_requests(only_retryable=True))
        assert len(retryable) < len(failures)  # the emulator's invalid requests are final
        report = retry_failed(config, RunDir.of(config), only_retryable=True)
        assert report.resubmitted == len(retryable)
        # The plain retry takes the final ones too (and whatever failed again meanwhile).
        assert retry_failed(config, RunDir.of(config)).resubmitted >= len(failures) - len(retryable)


# -- the results store ------------------------------------------------------------------------


def _store_with_batches(tmp_path: Path, *batches: tuple[str, list[str], str]) -> ResultsStore:
    store = ResultsStore(tmp_path / "results.sqlite")
    for batch_id, ids, at in batches:
        store.add_batch(
            BatchRecord("openai", batch_id, submitted_at=at, request_count=len(ids)), ids
        )
    return store


def ok(cid: str, text: str = "yes", **extra: Any) -> dict[str, Any]:
    return {"custom_id": cid, "status": "succeeded", "generated_text": text, **extra}


def err(cid: str, kind: str = "server_error", **extra: Any) -> dict[str, Any]:
    return {
        "custom_id": cid,
        "status": "error",
        "error_message": "boom",
        "error_kind": kind,
        **extra,
    }


def test_store_keeps_the_latest_success_and_never_a_failure_over_it(tmp_path: Path) -> None:
    with _store_with_batches(tmp_path, ("b1", ["x", "y"], "2025-01-01T00:00:00")) as store:
        store.store_results("openai", "b1", [ok("x", "first"), err("y")], unanswered=(MISSING, "-"))
        got = store.lookup(["x", "y"])
        assert (got["x"].state, got["y"].state) == (SUCCEEDED, FAILED)
        # y is resubmitted in b2 (a newer receipt): running until b2 is fetched.
        b2 = BatchRecord("openai", "b2", submitted_at="2025-01-02")
        store.add_batch(b2, ["y"], resubmission=True)
        b3 = BatchRecord("openai", "b3", submitted_at="2025-01-03")
        store.add_batch(b3, ["x"], resubmission=True)
        got = store.lookup(["x", "y"])
        assert (got["x"].state, got["y"].state) == (SUCCEEDED, RUNNING)
        store.store_results("openai", "b2", [ok("y", "second")], unanswered=(MISSING, "-"))
        store.store_results("openai", "b3", [err("x")], unanswered=(MISSING, "-"))
        got = store.lookup(["x", "y"])
        assert (got["x"].state, got["x"].text) == (SUCCEEDED, "first")  # failure never wins
        assert (got["y"].state, got["y"].text) == (SUCCEEDED, "second")
        store.store_results("openai", "b3", [ok("x", "third")], unanswered=(MISSING, "-"))
        assert store.lookup(["x"])["x"].text == "third"  # a later success replaces an earlier
        assert list(store.failed_requests()) == []


def test_store_outcomes_of_requests_without_a_result(tmp_path: Path) -> None:
    with _store_with_batches(
        tmp_path,
        ("done", ["a", "b"], "2025-01-01"),
        ("late", ["c"], "2025-01-01"),
        ("gone", ["d", "e"], "2025-01-01"),
    ) as store:
        store.store_results("openai", "done", [ok("a")], unanswered=(MISSING, "no result"))
        store.store_results(
            "openai",
            "gone",
            [err("d", "batch_expired", retryable=True)],
            unanswered=(EXPIRED, "batch gone expired"),
        )
        got = store.lookup(["a", "b", "c", "d", "e", "zzz"])
        assert [got[k].state for k in "abcde"] == [SUCCEEDED, MISSING, RUNNING, EXPIRED, EXPIRED]
        assert got["zzz"].state == MISSING and "no batch receipt" in got["zzz"].reason()
        assert "still running" in got["c"].reason()
        assert got["b"].reason() == "missing: no result"
        failed = list(store.failed_requests())
        assert sorted(cid for *_, cid in failed) == ["b", "d", "e"]  # never c (running)


def test_store_reopens_with_what_it_knew(tmp_path: Path) -> None:
    with _store_with_batches(tmp_path, ("b1", ["x"], "2025")) as store:
        store.set_status("openai", "b1", "completed", "completed")
        store.store_results(
            "openai", "b1", [ok("x", input_tokens=3, output_tokens=4)], unanswered=(MISSING, "-")
        )
    with ResultsStore(tmp_path / "results.sqlite") as store:
        record = store.batch("openai", "b1")
        assert record is not None and record.fetched and record.status == "completed"
        assert not store.add_batch(BatchRecord("openai", "b1"), ["x"])  # known: nothing to do
        x = store.lookup(["x"])["x"]
        assert (x.input_tokens, x.output_tokens) == (3, 4)


# -- the row rebuild ------------------------------------------------------------------------------


def test_an_invalid_json_answer_is_that_rows_error_only(tmp_path: Path) -> None:
    config = make_config(tmp_path, None, processor={"type": "batch_api", "provider": "openai"})
    builder = RowBuilder(config)
    row = {
        "id": "r1",
        "question": "q0",
        "answer": "__BATCH_SUBMITTED__:answer-text-0",
        "label": "__BATCH_SUBMITTED__:facts-text-0",
        "facts": "__BATCH_SUBMITTED__:facts-text-0",
        "summary": "__BATCH_SUBMITTED__:answer-text-0",
        "__row_key__": "0::0",
        "__errors__": None,
        "__usage__": {"input_tokens": 0, "output_tokens": 0},
        "__vars__": {
            "question": "q0",
            "answer": "__BATCH_SUBMITTED__:answer-text-0",
            "facts": "__BATCH_SUBMITTED__:facts-text-0",
        },
    }
    totals = MergeTotals()
    good = {
        "answer-text-0": Outcome(
            "answer-text-0", SUCCEEDED, "  hi \n", input_tokens=2, output_tokens=1
        ),
        "facts-text-0": Outcome(
            "facts-text-0", SUCCEEDED, '```json\n{"label": "L", "score": 3}\n```'
        ),
    }
    merged = builder.rebuild(dict(row), builder.pending(row), good, totals)
    assert merged["answer"] == "hi" and merged["facts"] == {"label": "L", "score": 3}
    assert merged["summary"] == "q0 -> hi" and merged["__errors__"] is None
    assert (merged["input_tokens"], merged["output_tokens"]) == (2, 1)
    assert list(merged)[:6] == ["id", "question", "answer", "label", "facts", "summary"]

    bad = dict(good, **{"facts-text-0": Outcome("facts-text-0", SUCCEEDED, '{"label": 1}')})
    failed = builder.rebuild(dict(row), builder.pending(row), bad, totals)
    assert set(failed["__errors__"]) == {"facts"} and "label" in failed["__errors__"]["facts"]
    # Only the fields that read the failed output are null.
    assert failed["facts"] is None and failed["label"] is None and failed["id"] == "r1"
    assert failed["answer"] == "hi" and failed["summary"] == "q0 -> hi"
    assert totals.requests["invalid"] == 1 and totals.rows_with_errors == 1

    expired = dict(good, **{"answer-text-0": Outcome("answer-text-0", EXPIRED, message="late")})
    out = builder.rebuild(dict(row), builder.pending(row), expired, totals)
    assert out["__errors__"] == {"answer": "expired: late"} and "input_tokens" not in out
    assert (
        out["answer"] is None
        and out["summary"] is None
        and out["facts"] == {"label": "L", "score": 3}
    )
