"""The keys an ``llm`` processor's ``default_sampling_params`` may hold, and the pairs a provider
refuses: a typo (``max_tokns``) or a refused pair fails at load, not after the first paid request.

Provider-specific fields that are not listed go under the explicit pass-through map
``extra_body``, whose keys are sent in the request body as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mmirage.config.errors import FieldError
from mmirage.config.validation import unknown_key_problem

FIELD = "default_sampling_params"
PASS_THROUGH = "extra_body"  # sent as is: whatever a provider or server takes beyond the list

# SGLang's sampling names (the original MMIRAGE's) and the OpenAI-style names llm_kit speaks;
# llm_kit maps each to the provider's own field (max_tokens → maxOutputTokens for Gemini...).
KNOWN_SAMPLING_KEYS: frozenset[str] = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "max_tokens",
        "max_new_tokens",
        "max_completion_tokens",
        "min_new_tokens",
        "seed",
        "stop",
        "stop_token_ids",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "n",
        "logprobs",
        "top_logprobs",
        "logit_bias",
        "ignore_eos",
        "skip_special_tokens",
        "reasoning_effort",
        "chat_template_kwargs",
        "custom_params",  # SGLang's, kept by the original MMIRAGE's configs
    }
)

# Providers that refuse two sampling keys together: (provider, key, key) → what to do.
_REFUSED_PAIRS: dict[tuple[str, str, str], str] = {
    ("anthropic", "temperature", "top_p"): (
        "temperature and top_p are mutually exclusive for anthropic (the API refuses both in "
        "one request); set only one"
    ),
}


def check_sampling(params: Mapping[str, Any], provider: str | None) -> None:
    """Refuse unknown keys (naming the nearest known one) and pairs ``provider`` refuses."""
    allowed = sorted(KNOWN_SAMPLING_KEYS | {PASS_THROUGH})
    for key in params:
        if key not in allowed:
            problem = unknown_key_problem(str(key), allowed)
            raise FieldError(
                f"{FIELD}.{key}",
                f"{problem}; put a provider-specific field under '{PASS_THROUGH}:' to send it "
                "as is",
            )
    extra = params.get(PASS_THROUGH)
    if extra is not None and not isinstance(extra, dict):
        raise FieldError(
            f"{FIELD}.{PASS_THROUGH}",
            "must be a mapping of fields sent in the request body as they are",
        )
    for (refusing, first, second), problem in _REFUSED_PAIRS.items():
        if provider == refusing and _set(params, first) and _set(params, second):
            raise FieldError(f"{FIELD}.{second}", problem)


def flat_sampling(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` with the ``extra_body`` map merged in (its keys do not override the listed
    ones, which were checked)."""
    flat = {k: v for k, v in params.items() if k != PASS_THROUGH}
    for key, value in (params.get(PASS_THROUGH) or {}).items():
        flat.setdefault(key, value)
    return flat


def _set(params: Mapping[str, Any], key: str) -> bool:
    return params.get(key) is not None or (params.get(PASS_THROUGH) or {}).get(key) is not None
