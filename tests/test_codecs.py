from __future__ import annotations

import base64
from pathlib import Path

import orjson
import pytest
from pydantic import BaseModel

from llm_kit import Message
from llm_kit.errors import ItemError
from llm_kit.providers import get_codec
from llm_kit.providers.base import parse_duration, retry_after_seconds
from llm_kit.schema import parse_response, response_schema

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


class Inner(BaseModel):
    name: str


class Outer(BaseModel):
    items: list[Inner]
    score: float


def conversation(image: str) -> list[Message]:
    return [Message.system("Be terse."), Message.user("What is it?", image_urls=[image])]


def test_openai_encode_images_schema_and_sampling(tmp_path: Path) -> None:
    image = tmp_path / "a.png"
    image.write_bytes(PNG)
    body = get_codec("openai").encode(
        "gpt-4o-mini",
        conversation(str(image)),
        {"temperature": 0, "max_tokens": 5},
        response_schema(Outer),
    )
    assert body["messages"][0] == {"role": "system", "content": "Be terse."}
    parts = body["messages"][1]["content"]
    assert parts[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert parts[1] == {"type": "text", "text": "What is it?"}
    assert body["temperature"] == 0 and body["max_tokens"] == 5
    fmt = body["response_format"]["json_schema"]
    assert fmt["name"] == "Outer"
    assert "$defs" not in orjson.dumps(fmt["schema"]).decode()  # refs inlined
    assert fmt["schema"]["properties"]["items"]["items"]["properties"]["name"]["type"] == "string"


def test_anthropic_encode_system_images_and_sampling_names() -> None:
    body = get_codec("anthropic").encode(
        "claude", conversation("https://example.com/a.jpg"), {"stop": "END", "seed": 3}, None
    )
    assert body["system"] == "Be terse."
    assert body["max_tokens"] == 1024  # required by Anthropic
    assert body["stop_sequences"] == ["END"]
    assert "seed" not in body  # Anthropic has no seed
    assert body["messages"][0]["content"][0] == {
        "type": "image",
        "source": {"type": "url", "url": "https://example.com/a.jpg"},
    }


def test_anthropic_refuses_unsupported_image_types(tmp_path: Path) -> None:
    bmp = tmp_path / "a.bmp"
    bmp.write_bytes(b"BM" + b"\0" * 64)
    with pytest.raises(ItemError, match=r"JPEG, PNG, GIF and WebP.*image/bmp"):
        get_codec("anthropic").encode("claude", conversation(str(bmp)), {}, None)


def test_anthropic_schema_uses_output_config() -> None:
    body = get_codec("anthropic").encode("claude", [Message.user("x")], {}, response_schema(Outer))
    assert body["output_config"]["format"]["type"] == "json_schema"


def test_gemini_encode_contents_inline_data_and_generation_config(tmp_path: Path) -> None:
    image = tmp_path / "a.png"
    image.write_bytes(PNG)
    codec = get_codec("gemini")
    assert (
        codec.path("models/gemini-2.5-flash") == "/v1beta/models/gemini-2.5-flash:generateContent"
    )
    body = codec.encode(
        "gemini-2.5-flash",
        [*conversation(str(image)), Message.assistant("A dot.")],
        {"temperature": 0.2, "max_tokens": 9, "top_p": 0.5},
        response_schema(Outer),
    )
    assert body["systemInstruction"] == {"parts": [{"text": "Be terse."}]}
    assert body["contents"][0]["parts"][0]["inlineData"]["mimeType"] == "image/png"
    assert body["contents"][1]["role"] == "model"
    config = body["generationConfig"]
    assert config["maxOutputTokens"] == 9 and config["topP"] == 0.5
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"]["type"] == "object"


def test_decode_usage_for_every_provider() -> None:
    openai = get_codec("openai").decode(
        {
            "choices": [{"message": {"content": "hi", "refusal": None}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2},
        }
    )
    assert (openai.text, openai.usage.input_tokens, openai.usage.output_tokens) == ("hi", 5, 2)
    anthropic = get_codec("anthropic").decode(
        {
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 7, "output_tokens": 3},
        }
    )
    assert (anthropic.text, anthropic.usage.total_tokens) == ("ab", 10)
    gemini = get_codec("gemini").decode(
        {
            "candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "STOP"}],
            "usageMetadata": {
                "promptTokenCount": 4,
                "candidatesTokenCount": 1,
                "thoughtsTokenCount": 2,
            },
        }
    )
    assert (gemini.text, gemini.usage.output_tokens, gemini.finish_reason) == ("x", 3, "STOP")


def test_error_classification() -> None:
    openai = get_codec("openai")
    quota = openai.error(
        429,
        {},
        b'{"error":{"message":"You exceeded your quota","type":"x","code":"insufficient_quota"}}',
    )
    assert not quota.retryable and quota.kind == "insufficient_quota"
    limited = openai.error(429, {"retry-after-ms": "1500", "retry-after": "9"}, b"{}")
    assert limited.retryable and limited.retry_after == 1.5
    assert not openai.error(400, {}, b"oops").retryable
    assert not openai.error(503, {"x-should-retry": "false"}, b"").retryable
    assert openai.error(409, {}, b"").retryable
    overloaded = get_codec("anthropic").error(
        529, {}, b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    )
    assert overloaded.retryable and overloaded.kind == "overloaded_error"
    assert "Overloaded" in str(overloaded)


def test_gemini_retry_info_and_daily_quota() -> None:
    body = {
        "error": {
            "code": 429,
            "message": "slow down",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "34s"}],
        }
    }
    error = get_codec("gemini").error(429, {}, orjson.dumps(body))
    assert error.retryable and error.retry_after == 34
    body["error"]["details"].append(
        {
            "@type": "type.googleapis.com/google.rpc.QuotaFailure",
            "violations": [{"quotaId": "GenerateRequestsPerDayPerProject"}],
        }
    )
    daily = get_codec("gemini").error(429, {}, orjson.dumps(body))
    assert not daily.retryable and daily.kind == "daily_quota_exhausted"


def test_gemini_blocked_prompt_is_not_retryable() -> None:
    from llm_kit.errors import ProviderError

    with pytest.raises(ProviderError, match="SAFETY") as info:
        get_codec("gemini").decode({"promptFeedback": {"blockReason": "SAFETY"}})
    assert not info.value.retryable


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("12ms", 0.012),
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("2m59.56s", 179.56),
        ("1h2m3s", 3723.0),
        ("7", 7.0),
        ("", None),
        ("soon", None),
    ],
)
def test_parse_go_durations(text: str, seconds: float | None) -> None:
    assert (
        parse_duration(text) == pytest.approx(seconds) if seconds else parse_duration(text) is None
    )


def test_retry_after_http_date_is_in_the_future() -> None:
    import time
    from email.utils import formatdate

    wait = retry_after_seconds({"retry-after": formatdate(time.time() + 30, usegmt=True)})
    assert wait is not None and 25 < wait <= 30


def test_rate_limit_headers_of_both_families() -> None:
    info = get_codec("openai").rate_limits(
        {
            "x-ratelimit-limit-requests": "600",
            "x-ratelimit-remaining-requests": "599",
            "x-ratelimit-reset-requests": "100ms",
            "x-ratelimit-limit-tokens": "150000",
        }
    )
    assert info is not None and info.limit_requests == 600 and info.reset_requests == 0.1
    assert info.limit_tokens == 150000 and info.remaining_tokens is None
    assert get_codec("anthropic").rate_limits({}) is None
    info = get_codec("anthropic").rate_limits(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2999-01-01T00:00:00Z",
        }
    )
    assert info is not None and info.remaining_requests == 0 and info.reset_requests > 1e9


def test_schema_parse_accepts_fences_and_reports_the_field() -> None:
    assert parse_response('```json\n{"items": [], "score": 1}\n```', Outer).score == 1
    from llm_kit.errors import ResponseValidationError

    with pytest.raises(ResponseValidationError, match=r"items\.0\.name"):
        parse_response('{"items": [{}], "score": 1}', Outer)
    with pytest.raises(ResponseValidationError, match="not valid JSON"):
        parse_response("{nope", Outer)


def test_openai_strict_mode_only_when_the_schema_allows_it() -> None:
    codec = get_codec("openai")
    strict = codec.encode("m", [Message.user("x")], {}, response_schema(Outer))
    fmt = strict["response_format"]["json_schema"]
    assert fmt["strict"] is True
    assert fmt["schema"]["additionalProperties"] is False
    assert fmt["schema"]["properties"]["items"]["items"]["additionalProperties"] is False

    class WithDefault(BaseModel):
        name: str
        note: str = ""

    loose = codec.encode("m", [Message.user("x")], {}, response_schema(WithDefault))
    assert loose["response_format"]["json_schema"]["strict"] is False


def test_schema_parse_accepts_raw_newlines_inside_strings() -> None:
    # llama.cpp's JSON grammar lets small models put a raw newline inside a string.
    assert (
        parse_response('{"items": [{"name": "a\nb"}], "score": 2}', Outer).items[0].name == "a\nb"
    )
