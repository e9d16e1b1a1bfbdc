"""Fingerprints of configs written before new optional fields existed stay what they were.

A changed fingerprint makes every published shard of a pipeline look stale, so the next run
computes (and pays for) them again. The values below were computed by the release before
``api_key_env``, ``engine_python``, the Hub options and ``storage_options`` existed; a new field
that changes them must be left out of the fingerprint while unset (see ``mmirage/rundir.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from mmirage.config import load_mmirage_config_dict
from mmirage.rundir import fingerprint

_PROCESSING = {
    "inputs": [{"name": "text", "key": "text"}],
    "outputs": [{"name": "a", "type": "llm", "prompt": "{{ text }}"}],
    "output_schema": {"a": "{{ a }}"},
}


def _config(processor: dict[str, Any], dataset: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "processors": [processor],
        "loading_params": {"state_dir": "/srv/state", "datasets": [dataset], **extra},
        "processing_params": _PROCESSING,
    }


PINNED = {
    "a live processor at a base_url": (
        _config(
            {
                "type": "llm",
                "base_url": "http://127.0.0.1:8000/v1",
                "model": "m",
                "default_sampling_params": {"temperature": 0, "max_new_tokens": 32},
            },
            {"path": "/srv/in.jsonl", "type": "JSONL", "output_dir": "/srv/out"},
            output_format="jsonl",
        ),
        "9501400143a9912d",
    ),
    "a launched server": (
        _config(
            {"type": "llm", "server_args": {"model_path": "/models/m"}},
            {"path": "/srv/in.jsonl", "type": "JSONL", "output_dir": "/srv/out3"},
        ),
        "cc6533681ea4592d",
    ),
}


@pytest.mark.parametrize("name", list(PINNED))
def test_an_existing_config_keeps_its_fingerprint(name: str) -> None:
    config, expected = PINNED[name]
    assert fingerprint(load_mmirage_config_dict(config)) == expected


def test_a_json_output_on_the_local_model_keeps_its_fingerprint() -> None:
    config = _config(
        {"type": "llm", "message_format": "local"},
        {"path": "/srv/in.parquet", "type": "parquet", "output_dir": "/srv/out2"},
    )
    config["processing_params"] = {
        **_PROCESSING,
        "outputs": [
            {
                "name": "a",
                "type": "llm",
                "output_type": "JSON",
                "prompt": "{{ text }}",
                "output_schema": {"x": {"type": "str"}},
            }
        ],
    }
    assert fingerprint(load_mmirage_config_dict(config)) == "f2f9fa33ed43baaf"


def test_a_field_that_changes_the_answers_changes_the_fingerprint() -> None:
    config, expected = PINNED["a live processor at a base_url"]
    other = {**config, "processors": [{**config["processors"][0], "model": "another"}]}
    assert fingerprint(load_mmirage_config_dict(other)) != expected
