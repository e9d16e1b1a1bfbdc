"""BatchJob handles, spooling and splitting — no network needed."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pydantic import BaseModel

from llm_kit import LLM, BatchConfig, BatchItem, ConfigError, Message
from llm_kit.batch import BatchJob, JobState, ProviderBatch
from llm_kit.batch.job import job_state, public_url
from llm_kit.batch.runner import spool
from llm_kit.providers import get_codec
from llm_kit.providers.anthropic_batch import AnthropicBatchBackend
from llm_kit.providers.batch_backend import BatchLimits, Chunk
from llm_kit.providers.gemini_batch import GeminiBatchBackend
from llm_kit.providers.openai_batch import TAG_KEY, OpenAIBatchBackend, _with_tag

KEY = "sk-never-in-a-file-42"


def items(n: int, **kwargs: object) -> list[BatchItem]:
    return [BatchItem(f"item {i}/x", [Message.user(f"row {i}")], **kwargs) for i in range(n)]  # type: ignore[arg-type]


def backend(cls: type = OpenAIBatchBackend, **options: object) -> OpenAIBatchBackend:
    return cls(get_codec(cls.name), None, "gpt-test", **options)  # type: ignore[no-any-return]


def test_spool_splits_by_count_and_by_bytes(tmp_path: Path) -> None:
    by_count = BatchLimits(max_requests=4, max_bytes=10**9)
    job, chunks = spool(
        items(10),
        backend=backend(),
        codec=get_codec("openai"),
        sampling={},
        limits=by_count,
        directory=tmp_path / "a",
        base_url="x",
    )
    assert [c.count for c in chunks] == [4, 4, 2]
    assert [c.first for c in chunks] == [0, 4, 8]
    line_size = chunks[0].bytes // 4
    by_bytes = BatchLimits(max_requests=None, max_bytes=line_size * 3 + 1)
    _, chunks = spool(
        items(10),
        backend=backend(),
        codec=get_codec("openai"),
        sampling={},
        limits=by_bytes,
        directory=tmp_path / "b",
        base_url="x",
    )
    assert all(c.bytes <= by_bytes.max_bytes for c in chunks)
    assert sum(c.count for c in chunks) == 10 and len(chunks) == 4
    first_line = orjson.loads(chunks[0].path.read_bytes().splitlines()[0])
    assert first_line["custom_id"] == "0" and first_line["url"] == "/v1/chat/completions"
    assert job.item_ids[0] == "item 0/x"  # the manifest maps custom_id "0" back to the item


def test_spool_chunk_files_fit_max_bytes_newlines_included(tmp_path: Path) -> None:
    def chunked(limits: BatchLimits, folder: str) -> list[Chunk]:
        return spool(
            items(10),
            backend=backend(),
            codec=get_codec("openai"),
            sampling={},
            limits=limits,
            directory=tmp_path / folder,
            base_url="x",
        )[1]

    (whole,) = chunked(BatchLimits(max_requests=None, max_bytes=10**9), "whole")
    line_size = len(whole.path.read_bytes().splitlines(keepends=True)[0])  # newline included
    exact = chunked(BatchLimits(max_requests=None, max_bytes=line_size * 3), "exact")
    assert [c.count for c in exact] == [3, 3, 3, 1]  # exact equality fits
    assert all(c.path.stat().st_size == c.bytes <= line_size * 3 for c in exact)
    short = chunked(BatchLimits(max_requests=None, max_bytes=line_size * 3 - 1), "short")
    assert [c.count for c in short] == [2, 2, 2, 2, 2]  # the newlines count


def test_anthropic_custom_ids_are_always_legal(tmp_path: Path) -> None:
    odd = [BatchItem("ünïcode id with spaces " + "x" * 80, [Message.user("hi")])]
    job, chunks = spool(
        odd,
        backend=backend(AnthropicBatchBackend),
        codec=get_codec("anthropic"),
        sampling={},
        limits=BatchLimits(10, 10**6),
        directory=tmp_path,
        base_url="x",
    )
    line = orjson.loads(chunks[0].path.read_bytes())
    assert line["custom_id"] == "0" and line["params"]["max_tokens"] == 1024
    assert job.item_ids == [odd[0].id]


def test_duplicate_ids_and_empty_jobs_are_refused_before_upload(tmp_path: Path) -> None:
    dupes = [*items(3), items(2)[1]]
    with pytest.raises(ConfigError, match=r"duplicate item id 'item 1/x'.*nothing was uploaded"):
        spool(
            dupes,
            backend=backend(),
            codec=get_codec("openai"),
            sampling={},
            limits=BatchLimits(10, 10**6),
            directory=tmp_path / "a",
            base_url="x",
        )
    with pytest.raises(ConfigError, match="the item list is empty"):
        spool(
            [],
            backend=backend(),
            codec=get_codec("openai"),
            sampling={},
            limits=BatchLimits(10, 10**6),
            directory=tmp_path / "b",
            base_url="x",
        )
    assert not list((tmp_path / "a").iterdir())  # the refused job left no requests behind
    # A spool directory holding another job's requests is refused: they could be resubmitted.
    kwargs = {
        "backend": backend(),
        "codec": get_codec("openai"),
        "sampling": {},
        "limits": BatchLimits(10, 10**6),
        "directory": tmp_path / "c",
        "base_url": "x",
    }
    spool(items(2), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="already holds the requests of another job"):
        spool(items(2), **kwargs)  # type: ignore[arg-type]


def test_unschematisable_response_model_is_refused(tmp_path: Path) -> None:
    class Node(BaseModel):
        children: list[Node]

    with pytest.raises(ConfigError, match="recursive"):
        spool(
            items(2, response_model=Node),
            backend=backend(),
            codec=get_codec("openai"),
            sampling={},
            limits=BatchLimits(10, 10**6),
            directory=tmp_path,
            base_url="x",
        )


def test_unreadable_image_is_rejected_not_uploaded(tmp_path: Path) -> None:
    bad = [*items(2), BatchItem("img", [Message.user("x", image_urls=[str(tmp_path / "no.png")])])]
    job, chunks = spool(
        bad,
        backend=backend(),
        codec=get_codec("openai"),
        sampling={},
        limits=BatchLimits(10, 10**6),
        directory=tmp_path / "s",
        base_url="x",
    )
    assert sum(c.count for c in chunks) == 2
    assert "cannot read image" in job.rejected[2]
    assert job.status().counts.errored == 1


def test_save_load_round_trip_without_secrets(tmp_path: Path) -> None:
    job = BatchJob(
        provider="openai",
        model="gpt",
        endpoint="/v1/chat/completions",
        base_url=f"https://user:{KEY}@proxy.example.com:8443/v1?key={KEY}",
        item_ids=["a", "b", "c"],
        metadata={1: {"row": 1}},
        rejected={2: "bad image"},
        batches=[
            ProviderBatch(
                id="batch_1", first=0, count=2, input_file_id="file-1", state=JobState.IN_PROGRESS
            )
        ],
    )
    path = tmp_path / "job.json"
    job.save(path)
    assert KEY not in path.read_text()
    loaded = BatchJob.load(path)
    assert loaded.base_url == "https://proxy.example.com:8443/v1"
    assert loaded.metadata == {1: {"row": 1}} and loaded.rejected == {2: "bad image"}
    assert loaded.batches[0].state is JobState.IN_PROGRESS
    assert loaded.batch_ids == ["batch_1"]


def test_bad_job_files_fail_with_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    with pytest.raises(ConfigError, match="does not exist"):
        BatchJob.load(path)
    path.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        BatchJob.load(path)
    path.write_text('{"format": "something-else"}')
    with pytest.raises(ConfigError, match="not an llm_kit batch job file"):
        BatchJob.load(path)
    path.write_text('{"format": "llm_kit.batch_job", "version": 99}')
    with pytest.raises(ConfigError, match="newer llm_kit"):
        BatchJob.load(path)


def test_job_from_another_provider_is_refused(tmp_path: Path) -> None:
    job = BatchJob(
        provider="anthropic", model="c", endpoint="/v1/messages", base_url="", item_ids=["a"]
    )
    llm = LLM(model="gpt", api_key=KEY)
    with pytest.raises(ConfigError, match="submitted to anthropic, but this LLM talks openai"):
        llm._check_job(job)


async def test_local_model_has_no_batch_api() -> None:
    pytest.importorskip("llama_cpp")
    llm = LLM(model="SmolLM2-135M-Instruct", message_format="local")
    with pytest.raises(ConfigError, match="'local' has no provider batch API"):
        await llm.submit_batch([BatchItem("a", [Message.user("x")])])


def test_job_state_precedence() -> None:
    s = JobState
    assert job_state([s.COMPLETED, s.IN_PROGRESS, s.PENDING]) is s.PENDING
    assert job_state([s.COMPLETED, s.COMPLETED]) is s.COMPLETED
    assert job_state([s.FAILED, s.FAILED]) is s.FAILED
    assert job_state([s.COMPLETED, s.EXPIRED, s.FAILED]) is s.EXPIRED
    assert s.CANCELED.is_terminal and not s.CANCELING.is_terminal
    assert public_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"


def test_config_caps_batch_size() -> None:
    llm = LLM(model="gpt", api_key=KEY, config=BatchConfig(batch_max_requests=7))
    limits = llm._limits(backend())
    assert limits.max_requests == 7 and limits.max_bytes == 200 * 1024 * 1024


def test_openai_batch_metadata_that_would_not_fit_is_refused_not_cut() -> None:
    fifteen = {f"k{i:02d}": "v" for i in range(15)}
    assert _with_tag(backend(metadata=fifteen).metadata, "t") == {**fifteen, TAG_KEY: "t"}
    with pytest.raises(ConfigError, match="holds 16 pairs; OpenAI allows 16"):
        backend(metadata={**fifteen, "k15": "v"})
    with pytest.raises(ConfigError, match="may not set 'llm_kit_tag'"):
        backend(metadata={TAG_KEY: "mine"})


def test_gemini_inlines_a_chunk_only_when_the_inline_body_itself_fits(tmp_path: Path) -> None:
    """The inline framing is longer than the spooled lines': a chunk just under the limit may
    not fit inline, and then goes as an uploaded file (``None`` here)."""
    gemini = backend(GeminiBatchBackend)
    _, chunks = spool(
        items(200),
        backend=gemini,
        codec=get_codec("gemini"),
        sampling={},
        limits=BatchLimits(None, 10**9),
        directory=tmp_path,
        base_url="x",
    )
    (chunk,) = chunks
    body = gemini._inline_body(chunk, "tag")
    assert body is not None and len(body) > chunk.bytes
    requests = orjson.loads(body)["batch"]["inputConfig"]["requests"]["requests"]
    assert [r["metadata"]["key"] for r in requests] == [str(i) for i in range(200)]
    gemini.inline_max_bytes = len(body)  # the lines fit under it, the inline body does not
    assert chunk.bytes < gemini.inline_max_bytes and gemini._inline_body(chunk, "tag") is None
