"""The submit side of batch_api: spooling/chunking, placeholders, receipts, dry run, resume.

A custom provider ("ledger", registered exactly as the spec's extension contract says) records
every chunk it is given in a JSONL ledger file, so the tests can count submissions across
processes and reruns. Provider wire formats are tested against the emulator elsewhere.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mmirage.config import load_mmirage_config_dict
from mmirage.config.batch_provider import BatchProviderConfig
from mmirage.core.process.batch.adapter import (
    BatchSubmissionAdapter,
    BatchSubmissionResult,
    MissingCredentialsError,
)
from mmirage.core.process.batch.processor import export_file
from mmirage.core.process.batch.provider_resolution import BatchProviderConfigRegistry
from mmirage.core.process.batch.registry import BatchAdapterRegistry
from mmirage.core.process.batch.spool import ChunkSpool, OversizedRequestError
from mmirage.core.shard import run_shard
from mmirage.errors import UserError

LEDGER_ENV = "LEDGER_LEDGER_PATH"  # where the fake provider writes (not a credential)


@dataclass
class LedgerBatchConfig(BatchProviderConfig):
    provider: str = "ledger"
    model: str = "ledger-1"


class LedgerBatchAdapter(BatchSubmissionAdapter):
    required_credentials = ("api_key",)
    fail_on_chunk: int | None = None  # class-level switch: raise when this chunk number comes

    def build_request(
        self, custom_id: str, payload: dict[str, Any], config: BatchProviderConfig
    ) -> dict[str, Any]:
        return {"custom_id": custom_id, "params": {"model": "ledger-1", **payload}}

    def submit_chunk(
        self, chunk_id: str, requests: Sequence[dict[str, Any]], config: BatchProviderConfig
    ) -> dict[str, Any]:
        if self.fail_on_chunk is not None and chunk_id.endswith(f"{self.fail_on_chunk:06d}"):
            raise ConnectionError("the ledger is closed")
        ledger = Path(os.environ[LEDGER_ENV])
        with open(ledger, "a") as f:
            f.write(json.dumps({"chunk": chunk_id, "ids": [r["custom_id"] for r in requests]}))
            f.write("\n")
        return {"id": f"batch-{chunk_id}", "status": "validating"}

    def parse_submission_result(self, raw_result: dict[str, Any]) -> BatchSubmissionResult:
        return BatchSubmissionResult(
            raw_result["id"], self._normalize_status(raw_result["status"]), raw_result
        )

    def check_batch_status(
        self, provider_batch_id: str, config: BatchProviderConfig
    ) -> BatchSubmissionResult:
        return BatchSubmissionResult(provider_batch_id, "completed")

    def retrieve_results(
        self, provider_batch_id: str, config: BatchProviderConfig
    ) -> Sequence[dict[str, Any]]:
        return []


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    BatchProviderConfigRegistry.register("ledger", LedgerBatchConfig)
    BatchAdapterRegistry.register("ledger", LedgerBatchAdapter)
    path = tmp_path / "ledger.jsonl"
    monkeypatch.setenv(LEDGER_ENV, str(path))
    monkeypatch.setenv("LEDGER_API_KEY", "secret-ledger-key-123")
    yield path
    LedgerBatchAdapter.fail_on_chunk = None
    BatchAdapterRegistry.unregister("ledger")
    BatchProviderConfigRegistry.unregister("ledger")


def write_dataset(path: Path, n: int, *, image: str | None = None) -> None:
    with open(path, "w") as f:
        for i in range(n):
            row: dict[str, Any] = {"q": f"question {i}"}
            if image is not None:
                row["img"] = image
            f.write(json.dumps(row) + "\n")


def make_config(tmp_path: Path, *, num_shards: int = 2, **provider: Any) -> Any:
    write_dataset(tmp_path / "a.jsonl", 7)
    write_dataset(tmp_path / "b.jsonl", 5)
    return load_mmirage_config_dict(
        {
            "processors": [
                {
                    "type": "batch_api",
                    "provider": "ledger",
                    "metadata_output_path": str(tmp_path / "meta" / "receipts.jsonl"),
                    **provider,
                }
            ],
            "loading_params": {
                "state_dir": str(tmp_path / "state"),
                "datasets": [
                    {"path": str(tmp_path / n), "type": "JSONL", "output_dir": str(tmp_path / o)}
                    for n, o in (("a.jsonl", "out_a"), ("b.jsonl", "out_b"))
                ],
                "num_shards": num_shards,
                "batch_size": 2,
                "output_format": "jsonl",
            },
            "processing_params": {
                "inputs": [{"name": "q", "key": "q"}],
                "outputs": [
                    {"name": "answer", "type": "batch_api", "prompt": "Answer: {{ q }}"},
                    {
                        "name": "facts",
                        "type": "batch_api",
                        "output_type": "JSON",
                        "prompt": "Facts about {{ q }}",
                        "output_schema": {"fact": "str", "n": "int"},
                    },
                ],
                "output_schema": {
                    "question": "{{ q }}",
                    "answer": "{{ answer }}",
                    "fact": "{{ facts.fact }}",
                },
            },
        }
    )


def ledger_ids(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [i for line in path.read_text().splitlines() for i in json.loads(line)["ids"]]


def published(tmp_path: Path, out: str, shard: int, num_shards: int = 2) -> list[dict[str, Any]]:
    text = (tmp_path / out / f"shard-{shard}-of-{num_shards}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


# -- spool ---------------------------------------------------------------------------------


def line(size: int) -> bytes:
    return b"x" * size + b"\n"


def test_chunks_close_on_bytes_with_exact_equality_fitting(tmp_path: Path) -> None:
    spool = ChunkSpool(tmp_path, max_bytes=10, max_requests=None)
    spool.recover()
    closed = spool.add_many([("a", 0, 0, line(5)), ("b", 1, 0, line(3)), ("c", 2, 0, line(1))])
    assert [(c.count, c.bytes, c.flush_reason) for c in closed] == [(2, 10, "full_chunk")]
    rest = spool.close()
    assert [(c.count, c.bytes) for c in rest] == [(1, 2)]
    assert [i for i, _, _ in closed[0].read_ids()] == ["a", "b"]


def test_chunks_close_on_count(tmp_path: Path) -> None:
    spool = ChunkSpool(tmp_path, max_bytes=1000, max_requests=2)
    spool.recover()
    closed = spool.add_many([(str(i), i, 0, line(3)) for i in range(5)])
    assert [c.count for c in closed] == [2, 2]
    assert [c.count for c in spool.close()] == [1]


def test_oversized_isolate_gets_its_own_chunk(tmp_path: Path) -> None:
    spool = ChunkSpool(tmp_path, max_bytes=10, max_requests=None, policy="isolate")
    spool.recover()
    closed = spool.add_many([("a", 0, 0, line(3)), ("big", 1, 0, line(50)), ("c", 2, 0, line(3))])
    assert [(c.count, c.oversized) for c in closed] == [(1, False), (1, True)]
    assert [i for i, _, _ in closed[1].read_ids()] == ["big"]
    assert [c.count for c in spool.close()] == [1]


def test_oversized_reject_names_the_request_and_keeps_earlier_lines(tmp_path: Path) -> None:
    spool = ChunkSpool(tmp_path, max_bytes=10, max_requests=None, policy="reject")
    spool.recover()
    with pytest.raises(OversizedRequestError, match=r"'big' is 51 bytes.*max_chunk_bytes \(10\)"):
        spool.add_many([("a", 0, 0, line(3)), ("big", 1, 0, line(50))])
    assert [c.count for c in spool.close()] == [1]


def test_recovery_keeps_whole_requests_and_remembers_ids(tmp_path: Path) -> None:
    spool = ChunkSpool(tmp_path, max_bytes=10, max_requests=None)
    spool.recover()
    spool.add_many([("a", 0, 0, line(4)), ("b", 1, 0, line(4)), ("c", 2, 0, line(4))])
    # A kill between the two appends: a request line whose id never reached disk.
    with open(tmp_path / "chunk-000002.jsonl", "ab") as f:
        f.write(line(2))
    again = ChunkSpool(tmp_path, max_bytes=10, max_requests=None)
    pending = again.recover()
    assert again.spooled == {"a", "b", "c"}
    assert [(c.number, c.count) for c in pending] == [(1, 2)]  # closed, never submitted
    assert [(c.number, c.count, c.bytes) for c in again.close()] == [(2, 1, 5)]
    assert (tmp_path / "chunk-000002.jsonl").read_bytes() == line(4)


# -- the processor in a shard run -------------------------------------------------------------


def test_run_submits_chunks_and_writes_placeholders_and_receipts(
    tmp_path: Path, ledger: Path
) -> None:
    config = make_config(tmp_path, max_requests_per_chunk=3)
    for shard in (0, 1):
        run_shard(config, shard, run_id="r1")
    ids = ledger_ids(ledger)
    assert len(ids) == len(set(ids)) == 2 * 12  # two outputs × 12 rows, each once
    rows = published(tmp_path, "out_a", 0) + published(tmp_path, "out_a", 1)
    rows += published(tmp_path, "out_b", 0) + published(tmp_path, "out_b", 1)
    answers = [r["answer"] for r in rows]
    # Global source indices: dataset b starts after dataset a's 7 rows.
    assert answers == [f"__BATCH_SUBMITTED__:answer-text-{i}" for i in range(12)]
    assert all(r["fact"] == f"__BATCH_SUBMITTED__:facts-text-{i}" for i, r in enumerate(rows))
    assert rows[8]["__vars__"] == {
        "q": "question 1",
        "answer": "__BATCH_SUBMITTED__:answer-text-8",
        "facts": "__BATCH_SUBMITTED__:facts-text-8",
    }
    receipts = [
        json.loads(line)
        for path in sorted(glob.glob(str(tmp_path / "meta" / "receipts.text.r1.jsonl")))
        for line in Path(path).read_text().splitlines()
    ]
    assert all(r["submitted_request_count"] <= 3 for r in receipts)
    mapped = {cid: idx for r in receipts for cid, idx in r["custom_id_to_source_index"].items()}
    assert mapped == {f"{o}-text-{i}": i for o in ("answer", "facts") for i in range(12)}
    assert {r["shard_id"] for r in receipts} == {0, 1}
    assert {r["run_id"] for r in receipts} == {"r1"}
    assert all(os.path.exists(r["spool_path"]) for r in receipts)
    assert all(r["provider_batch_id"].startswith("batch-") for r in receipts)
    assert (
        "secret-ledger-key-123"
        not in (tmp_path / "meta").joinpath("receipts.text.r1.jsonl").read_text()
    )
    # The JSON output's payload carries its schema for the provider.
    # Chunks are submitted two at a time, so receipts come in completion order: find the line.
    lines = [
        json.loads(line)
        for r in receipts
        for line in Path(r["spool_path"]).read_text().splitlines()
    ]
    first = next(line for line in lines if line["custom_id"] == "answer-text-0")
    assert first["params"]["messages"] == [{"role": "user", "content": "Answer: question 0"}]


def test_rerun_after_success_submits_nothing(tmp_path: Path, ledger: Path) -> None:
    config = make_config(tmp_path)
    for shard in (0, 1):
        run_shard(config, shard)
    before = ledger_ids(ledger)
    for shard in (0, 1):
        assert run_shard(config, shard).skipped
    assert ledger_ids(ledger) == before


def test_failed_submission_fails_the_shard_and_the_rerun_submits_the_rest_once(
    tmp_path: Path, ledger: Path
) -> None:
    config = make_config(tmp_path, num_shards=1, max_requests_per_chunk=4)
    LedgerBatchAdapter.fail_on_chunk = 2
    with pytest.raises(RuntimeError, match="submitting a batch to ledger failed"):
        run_shard(config, 0)
    assert not (tmp_path / "out_a" / "shard-0-of-1.jsonl").exists()
    LedgerBatchAdapter.fail_on_chunk = None
    run_shard(config, 0)
    ids = ledger_ids(ledger)
    assert sorted(ids) == sorted(f"{o}-text-{i}" for o in ("answer", "facts") for i in range(12))


def test_missing_key_fails_before_any_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEDGER_API_KEY")
    config = make_config(tmp_path)
    with pytest.raises(MissingCredentialsError, match="LEDGER_API_KEY"):
        run_shard(config, 0)
    assert not (tmp_path / "out_a" / ".parts").exists()


def test_dry_run_exports_requests_without_a_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ledger: Path
) -> None:
    monkeypatch.delenv("LEDGER_API_KEY")
    config = make_config(tmp_path, num_shards=1, max_requests_per_chunk=5)
    run_shard(config, 0, run_id="abc123", export_prompts=str(tmp_path / "prompts.jsonl"))
    assert not ledger.exists()  # nothing submitted
    lines = [json.loads(x) for x in (tmp_path / "prompts.abc123.jsonl").read_text().splitlines()]
    assert len(lines) == 24
    assert lines[0] == {
        "batch_id": "text-s0-chunk-000001",
        "request": {
            "custom_id": "answer-text-0",
            "params": {
                "model": "ledger-1",
                "messages": [{"role": "user", "content": "Answer: question 0"}],
                "response_schema": None,
            },
        },
    }
    receipts = tmp_path / "meta" / "receipts.dry-run.text.abc123.jsonl"
    statuses = {json.loads(x)["status"] for x in receipts.read_text().splitlines()}
    assert statuses == {"dry_run"}
    assert not glob.glob(str(tmp_path / "meta" / "receipts.text.*.jsonl"))


def test_export_path_naming() -> None:
    assert str(export_file("/tmp/prompts.jsonl", "a4f9c2")) == "/tmp/prompts.a4f9c2.jsonl"
    assert str(export_file("/tmp/out", "a4f9c2")) == "/tmp/out/exported_prompts.a4f9c2.jsonl"


def image_pipeline(tmp_path: Path, processor: dict[str, Any]) -> Any:
    """A batch_api caption of each row's image (``img``, under ``tmp_path``) into ``img_out``."""
    return load_mmirage_config_dict(
        {
            "processors": [{"type": "batch_api", **processor}],
            "loading_params": {
                "state_dir": str(tmp_path / "state2"),
                "output_format": "jsonl",
                "datasets": [
                    {
                        "path": str(tmp_path / "a.jsonl"),
                        "type": "JSONL",
                        "output_dir": str(tmp_path / "img_out"),
                        "image_base_path": str(tmp_path),
                    }
                ],
            },
            "processing_params": {
                "inputs": [
                    {"name": "q", "key": "q"},
                    {"name": "img", "key": "img", "type": "image"},
                ],
                "outputs": [{"name": "cap", "type": "batch_api", "prompt": "Describe {{ q }}"}],
                "output_schema": {"cap": "{{ cap }}"},
            },
        }
    )


def test_rows_with_missing_images_fail_alone(tmp_path: Path, ledger: Path) -> None:
    write_dataset(tmp_path / "a.jsonl", 3, image=str(tmp_path / "nope.png"))
    run_shard(image_pipeline(tmp_path, {"provider": "ledger"}), 0)
    rows = [json.loads(x) for x in (tmp_path / "img_out" / "shard-0-of-1.jsonl").open()]
    assert len(rows) == 3
    assert all(r["__errors__"] and "nope.png" in json.dumps(r["__errors__"]) for r in rows)
    assert ledger_ids(ledger) == []


def test_an_image_type_the_provider_refuses_stops_the_run_naming_the_row_and_file(
    tmp_path: Path,
) -> None:
    """The batch page: anthropic "raises before submission on anything else"."""
    (tmp_path / "pic.bmp").write_bytes(b"BM" + bytes(60))  # Anthropic takes no BMP
    write_dataset(tmp_path / "a.jsonl", 1, image="pic.bmp")
    cfg = image_pipeline(tmp_path, {"provider": "anthropic", "model": "claude"})
    with pytest.raises(UserError) as refused:
        run_shard(cfg, 0, export_prompts=str(tmp_path / "prompts.jsonl"))
    message = str(refused.value)
    assert message.startswith("row 0::0: an image of ") and "pic.bmp' is image/bmp" in message
    assert message.count("cap-multimodal-0") == 1 and "correct extension" in message
    assert not (tmp_path / "img_out" / "shard-0-of-1.jsonl").exists()


def _two_outputs(second_prompt: str, first_name: str = "answer") -> dict[str, Any]:
    return {
        "processors": [
            {"type": "batch_api", "provider": "ledger"},
            {"type": "llm", "message_format": "local"},
        ],
        "loading_params": {"datasets": [{"path": "x.jsonl", "type": "JSONL", "output_dir": "o"}]},
        "processing_params": {
            "inputs": [{"name": "q", "key": "q"}],
            "outputs": [
                {"name": first_name, "type": "batch_api", "prompt": "{{ q }}"},
                {"name": "critique", "type": "llm", "prompt": second_prompt},
            ],
            "output_schema": {"a": f"{{{{ {first_name} }}}}"},
        },
    }


def test_a_later_prompt_cannot_read_a_batch_output() -> None:
    from mmirage.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"outputs\[1\]\.prompt.*'answer', a batch_api output"):
        load_mmirage_config_dict(_two_outputs("Critique {{ answer }}"))
    load_mmirage_config_dict(_two_outputs("Critique {{ q }}"))  # inputs are fine


def test_batch_output_names_must_fit_a_custom_id() -> None:
    from mmirage.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"outputs\[0\]\.name.*cannot start a batch custom_id"):
        load_mmirage_config_dict(_two_outputs("{{ q }}", first_name="x" * 41))


def test_a_failed_last_submission_is_made_by_the_rerun_even_with_no_row_left(
    tmp_path: Path, ledger: Path
) -> None:
    config = make_config(tmp_path, num_shards=1)  # one chunk per modality: sent by finish()
    LedgerBatchAdapter.fail_on_chunk = 1
    with pytest.raises(RuntimeError, match="submitting a batch to ledger failed"):
        run_shard(config, 0)
    assert ledger_ids(ledger) == []
    LedgerBatchAdapter.fail_on_chunk = None
    report = run_shard(config, 0)
    assert report.resumed_rows == 7  # dataset a was all checkpointed: only its chunk was owed
    assert sorted(ledger_ids(ledger)) == sorted(
        f"{o}-text-{i}" for o in ("answer", "facts") for i in range(12)
    )


def test_recompute_sends_only_the_requests_whose_line_changed(tmp_path: Path, ledger: Path) -> None:
    config = make_config(tmp_path, num_shards=1)
    run_shard(config, 0)
    changed = make_config(tmp_path, num_shards=1)
    changed.processing_params.outputs[0].prompt = "Please answer: {{ q }}"
    run_shard(changed, 0, force=True)
    sent = ledger_ids(ledger)
    assert len(sent) == 36  # every request once, then `answer`'s again: its prompt changed
    assert sorted(sent[24:]) == sorted(f"answer-text-{i}" for i in range(12))
    spools = sorted((tmp_path / "state").rglob("chunk-*.jsonl"))
    text = "".join(p.read_text() for p in spools)
    assert "Please answer: question 3" in text and "Answer: question 3" in text  # both kept
    assert not any(".superseded-" in str(p) for p in spools)  # retry still finds the old lines
    run_shard(changed, 0, force=True)
    assert len(ledger_ids(ledger)) == 36  # nothing changed since: nothing sent


def test_redaction_and_public_fields() -> None:
    from mmirage.core.process.batch.receipts import public_fields, redact

    raw = {"id": "b1", "request": {"headers": {"Authorization": "Bearer sk-1"}}, "n": ["sk-1"]}
    assert public_fields(raw) == {"id": "b1", "request": {"headers": {}}, "n": ["sk-1"]}
    assert redact(raw, ["sk-1"])["n"] == ["***"]
    assert redact("failed ?key=sk-1", ["sk-1"]) == "failed ?key=***"


def test_a_malformed_receipt_line_is_skipped(tmp_path: Path) -> None:
    from mmirage.core.process.batch.receipts import read_receipts

    path = tmp_path / "r.text.abc.jsonl"
    good = {"provider": "openai", "provider_batch_id": "b2", "custom_id_to_source_index": {}}
    bad = {"provider": "openai", "provider_batch_id": "b1", "custom_id_to_source_index": [1]}
    path.write_text(json.dumps(bad) + "\n" + json.dumps(good) + "\n")
    assert [r.batch_id for r in read_receipts([str(path)])] == ["b2"]
