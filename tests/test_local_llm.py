"""LLM(message_format="local"): the embedded model behind the same pipeline as a provider."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel

from llm_kit import LLM, BatchItem, ConfigError, Message

pytest.importorskip("llama_cpp")


class Sentiment(BaseModel):
    label: Literal["positive", "negative", "neutral"]


async def test_local_model_through_the_pipeline(tmp_path: Path) -> None:
    llm = LLM(model="SmolLM2-135M-Instruct", message_format="local", max_tokens=16, temperature=0)
    items = [
        BatchItem("plain", [Message.system("Answer briefly."), Message.user("Name a colour.")]),
        BatchItem("json", [Message.user("I love it! Sentiment?")], response_model=Sentiment),
        BatchItem("image", [Message.user("What is this?", image_urls=["https://x/y.jpg"])]),
    ]
    out = tmp_path / "local.jsonl"
    assert await llm.batch_to_jsonl(items, out) == 3
    results = {r.id: r async for r in llm.batch_stream(items)}
    assert results["plain"].ok and isinstance(results["plain"].response, str)
    assert results["plain"].usage is not None and results["plain"].usage.output_tokens > 0
    assert results["json"].ok and isinstance(results["json"].response, Sentiment)
    assert results["image"].ok  # text-only model: the image part is ignored, not an error


def test_missing_local_model_file_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"local model file .*nope\.gguf does not exist"):
        LLM(model=str(tmp_path / "nope.gguf"), message_format="local")


@pytest.mark.slow  # the whole `make demo` on the CPU model: a minute of both cores
def test_quickstart_labels_the_reviews(tmp_path: Path) -> None:
    """`make demo`'s pipeline, as shipped: every review gets one of the two labels, mostly right."""
    import shutil
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "examples" / "quickstart", tmp_path / "examples" / "quickstart")
    mmirage = Path(sys.executable).with_name("mmirage")
    command = [str(mmirage)] if mmirage.exists() else [sys.executable, "-m", "mmirage"]
    run = subprocess.run(
        [*command, "run", "examples/quickstart/config.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr
    from datasets import load_from_disk

    rows = load_from_disk(str(tmp_path / "out" / "quickstart" / "data" / "merged"))
    assert rows["id"] == list(range(1, 9))
    assert all(errors is None for errors in rows["__errors__"])
    assert set(rows["sentiment"]) <= {"positive", "negative"}
    expected = ["positive", "negative"] * 4  # the reviews alternate
    right = sum(got == want for got, want in zip(rows["sentiment"], expected, strict=True))
    assert right >= 6, rows["sentiment"]
