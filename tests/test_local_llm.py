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
