from __future__ import annotations

import base64
from pathlib import Path

import pytest
from pydantic import BaseModel

from llm_kit import BatchItem, BatchResult, ConfigError, Message, Usage
from llm_kit.errors import ItemError
from llm_kit.types import BatchConfig, ImagePart, TextPart

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


class Label(BaseModel):
    label: str


def test_message_user_with_images_keeps_images_before_text() -> None:
    message = Message.user("Caption:", image_urls=["https://example.com/a.jpg"])
    assert message.role == "user"
    assert message.content == (ImagePart("https://example.com/a.jpg"), TextPart("Caption:"))
    assert message.text == "Caption:"


def test_message_user_needs_content() -> None:
    with pytest.raises(ConfigError, match="needs text or at least one image"):
        Message.user("")


def test_local_image_becomes_data_url(tmp_path: Path) -> None:
    path = tmp_path / "pixel.bin"  # the type is sniffed from the bytes, not the name
    path.write_bytes(PNG)
    url = ImagePart(str(path)).resolved_url()
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == PNG


def test_unreadable_image_is_an_item_error(tmp_path: Path) -> None:
    with pytest.raises(ItemError, match=r"cannot read image .*missing\.png"):
        ImagePart(str(tmp_path / "missing.png")).resolved_url()


def test_batch_item_accepts_dict_messages_and_int_ids() -> None:
    item = BatchItem(7, [{"role": "user", "content": "hi"}])  # type: ignore[arg-type]
    assert item.id == "7"
    assert item.messages == [Message("user", (TextPart("hi"),))]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"id": "", "messages": [Message.user("x")]}, "non-empty string"),
        ({"id": "a", "messages": []}, "messages is empty"),
        ({"id": "a", "messages": Message.user("x")}, "must be a list"),
        ({"id": "a", "messages": [{"role": "robot", "content": "x"}]}, "role must be one of"),
        ({"id": "a", "messages": [Message.user("x")], "response_model": dict}, "BaseModel"),
        (
            {"id": "a", "messages": [Message.user("x")], "metadata": {"f": object()}},
            "metadata must be JSON-serialisable",
        ),
        (
            {"id": "a", "messages": [Message.user("x")], "sampling": {"max_tokens": object()}},
            "sampling must be JSON-serialisable",
        ),
    ],
)
def test_malformed_items_fail_with_one_sentence(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        BatchItem(**kwargs)


def test_batch_result_round_trips_through_json_dict() -> None:
    result = BatchResult(
        "x", True, Label(label="cat"), usage=Usage(3, 4), metadata={"row": 1}, attempts=2
    )
    data = result.to_dict()
    assert list(data)[:3] == ["id", "ok", "retryable"]  # the resume scan relies on this order
    assert data["response"] == {"label": "cat"}
    back = BatchResult.from_dict(data)
    assert back.usage == Usage(3, 4)
    assert back.metadata == {"row": 1}
    assert back.attempts == 2


def test_batch_config_defaults_and_validation() -> None:
    config = BatchConfig()
    assert config.on_failure == "record"
    with pytest.raises(ValueError, match="on_failure"):
        BatchConfig(on_failure="explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="worker_concurrency"):
        BatchConfig(worker_concurrency=0)
    with pytest.raises(ValueError, match="extra"):
        BatchConfig(concurrency=3)  # type: ignore[call-arg]
