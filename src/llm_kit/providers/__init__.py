"""One codec per wire format; ``message_format`` picks it."""

from __future__ import annotations

from llm_kit.errors import ConfigError
from llm_kit.providers.anthropic import AnthropicCodec
from llm_kit.providers.base import Codec, Completion, RateLimitInfo
from llm_kit.providers.gemini import GeminiCodec
from llm_kit.providers.openai import OpenAICodec

CODECS: dict[str, type[Codec]] = {
    "openai": OpenAICodec,
    "anthropic": AnthropicCodec,
    "gemini": GeminiCodec,
}
MESSAGE_FORMATS = (*CODECS, "local")


def get_codec(message_format: str) -> Codec:
    try:
        return CODECS[message_format]()
    except KeyError:
        raise ConfigError(
            f"unknown message_format {message_format!r}; use one of: {', '.join(MESSAGE_FORMATS)}"
        ) from None


__all__ = ["CODECS", "MESSAGE_FORMATS", "Codec", "Completion", "RateLimitInfo", "get_codec"]
