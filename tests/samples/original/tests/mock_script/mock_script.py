"""Stands in for the original's tests/mock_script/mock_script.py (not published with the
samples): the function config_mock_custom_module.yaml names, with the original's contract
(it receives the row's MMIRAGE variables, not the raw row)."""

from __future__ import annotations

from typing import Any


def process_text(variables: dict[str, Any]) -> str:
    return "PROCESSED: " + str(variables["text"]).upper()
