"""The custom function of custom_function.yaml: plain Python after an LLM output.

mmirage calls ``triage(variables, row)`` once per row, in a worker process:

* ``variables`` holds the row's inputs and the outputs computed before this one (here the
  LLM's ``draft``), by the names the config gives them;
* ``row`` is the raw source row, so fields that no prompt needs (``priority``) need no input.

Return plain, picklable data (str, numbers, lists, dicts): it becomes the output's value. An
exception or a call past ``timeout_ms`` gives the row the processor's ``fallback_value`` and an
error saying why.
"""

from __future__ import annotations

from typing import Any

# Promise words a support reply must never contain without a human checking it first.
_RISKY = ("refund", "guarantee", "compensation", "free of charge")
_TARGET_HOURS = {"high": 4, "medium": 24, "low": 72}


def triage(variables: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    draft: str = variables["draft"]
    priority = str(row.get("priority", "low"))
    risky = sorted(word for word in _RISKY if word in draft.lower())
    return {
        "words": len(draft.split()),
        "greets_customer": variables["customer"] in draft,
        "needs_review": bool(risky) or priority == "high",
        "risky_words": risky,
        "reply_within_hours": _TARGET_HOURS.get(priority, 72),
    }
