"""The recipes of ``examples/recipes/`` run as documented and publish what they promise.

``examples/recipes/run.py`` runs once, as a user would, on a copy of the recipes in a temporary
directory laid out like the repository (the configs' paths are relative to its root). It starts
the provider emulator itself. The tests then read every published row: each source row is there,
in order and without errors. JSON fields have the types and bounds that the recipe's own schema
declares. The emulator counted the images (85 input tokens each), so they were really sent. The
custom function's value is what the function computes from the row and the LLM's draft, and
its ``fallback_value`` is used as the config's comments say.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mmirage.config import load_mmirage_config
from mmirage.config.processing_params import LLMOutput
from mmirage.config.processors import CustomProcessorConfig, LLMProcessorConfig

REPO = Path(__file__).resolve().parents[1]
RECIPES_DIR = REPO / "examples" / "recipes"
RECIPES = ("openai_compatible", "structured_json", "images", "custom_function")
IMAGE_TOKENS = 85  # what the emulator counts per image received
MMIRAGE = Path(sys.executable).with_name("mmirage")

Row = dict[str, Any]


def read_jsonl(path: Path) -> list[Row]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def copy_recipes(root: Path) -> None:
    shutil.copytree(
        RECIPES_DIR, root / "examples" / "recipes", ignore=shutil.ignore_patterns("__pycache__")
    )


def run_script(root: Path, *recipes: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "MMIRAGE_"))}
    return subprocess.run(
        [sys.executable, str(root / "examples" / "recipes" / "run.py"), *recipes],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@dataclass
class Ran:
    root: Path
    stdout: str

    def rows(self, name: str) -> list[Row]:
        return read_jsonl(self.root / "out" / "recipes" / name / "data" / "shard-0-of-1.jsonl")

    def source(self, dataset: str) -> list[Row]:
        return read_jsonl(self.root / "examples" / "recipes" / "data" / dataset)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Ran:
    root = tmp_path_factory.mktemp("repo")
    copy_recipes(root)
    done = run_script(root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return Ran(root, done.stdout)


def check_rows(rows: list[Row], source: list[Row], check: Callable[[Row, Row], None]) -> None:
    """Every source row is published once, in order, without errors; then the recipe's check."""
    assert len(rows) == len(source)
    for index, (row, src) in enumerate(zip(rows, source, strict=True)):
        assert row["__row_key__"] == f"0::{index}"
        assert row["__errors__"] is None, row
        assert row["__usage__"]["input_tokens"] > 0 and row["__usage__"]["output_tokens"] > 0
        assert row["id"] == src["id"]
        check(row, src)


# -- the configs -------------------------------------------------------------------------------


def test_every_recipe_is_run_and_tested() -> None:
    assert {p.stem for p in RECIPES_DIR.glob("*.yaml")} == set(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_config_loads(name: str) -> None:
    # Without OPENAI_BASE_URL the recipes fall back to the emulator's documented port.
    config = load_mmirage_config(RECIPES_DIR / f"{name}.yaml", env={})
    llm = [p for p in config.processors if isinstance(p, LLMProcessorConfig)]
    assert len(llm) == 1
    assert llm[0].base_url == "http://127.0.0.1:8765/v1"
    assert llm[0].model == "gpt-4o-mini"
    assert config.loading_params.output_format == "jsonl"
    assert config.loading_params.state_dir == f"out/recipes/{name}/state"
    (dataset,) = config.loading_params.datasets
    assert dataset.output_dir == f"out/recipes/{name}/data"
    assert (REPO / str(dataset.path)).is_file()  # each recipe ships its own data


def test_openai_compatible_config_sets_pacing() -> None:
    config = load_mmirage_config(
        RECIPES_DIR / "openai_compatible.yaml",
        env={"OPENAI_BASE_URL": "http://server:8000/v1", "OPENAI_MODEL": "qwen"},
    )
    (llm,) = config.processors
    assert isinstance(llm, LLMProcessorConfig)
    assert (llm.base_url, llm.model) == ("http://server:8000/v1", "qwen")
    assert llm.worker_concurrency and llm.rpm and llm.tpm and llm.request_timeout


def test_custom_function_config() -> None:
    config = load_mmirage_config(RECIPES_DIR / "custom_function.yaml", env={})
    custom = [p for p in config.processors if isinstance(p, CustomProcessorConfig)]
    assert len(custom) == 1
    assert (REPO / custom[0].script_path).is_file()
    assert custom[0].timeout_ms and isinstance(custom[0].fallback_value, dict)
    names = [o.name for o in config.processing_params.outputs]
    assert names == ["draft", "checks"]  # the function runs after the LLM output


# -- the runs ----------------------------------------------------------------------------------


def test_run_prints_each_output(ran: Ran) -> None:
    for name in RECIPES:
        assert f"$ mmirage run examples/recipes/{name}.yaml" in ran.stdout
        assert f"out/recipes/{name}/data/shard-0-of-1.jsonl; the first:" in ran.stdout


def test_openai_compatible(ran: Ran) -> None:
    def check(row: Row, src: Row) -> None:
        meta = src["meta"]
        assert set(row) == {"id", "topic", "explanation", "__row_key__", "__errors__", "__usage__"}
        assert row["topic"] == meta["topic"]
        assert row["explanation"].startswith(
            f"echo: Explain {meta['topic']} to {meta['audience']} in two short sentences."
        )

    check_rows(ran.rows("openai_compatible"), ran.source("questions.jsonl"), check)


def test_structured_json(ran: Ran) -> None:
    config = load_mmirage_config(RECIPES_DIR / "structured_json.yaml", env={})
    (review,) = config.processing_params.outputs
    assert isinstance(review, LLMOutput) and review.is_json
    model = review.schema.pydantic_model()

    def check(row: Row, src: Row) -> None:
        # The fields the row read from the answer are the answer's own JSON types, not strings.
        assert type(row["rating"]) is int and 1 <= row["rating"] <= 5
        assert type(row["confidence"]) is float and 0 <= row["confidence"] <= 1
        assert type(row["would_recommend"]) is bool
        assert row["sentiment"] in ("positive", "negative", "neutral")
        assert isinstance(row["aspects"], list) and len(row["aspects"]) <= 3
        for aspect in row["aspects"]:
            assert set(aspect) == {"name", "positive"}
            assert isinstance(aspect["name"], str) and type(aspect["positive"]) is bool
        summary = row["summary"]
        assert set(summary) == {"headline", "words"}
        assert type(summary["words"]) is int and 1 <= summary["words"] <= 12
        assert row["headline"] == summary["headline"]
        # A template mixing text and a field renders as a string.
        assert row["label"] == f"{src['product']}: {row['rating']}/5"
        assert row["product"] == src["product"]
        # The reassembled answer validates against the recipe's own schema (strictly).
        answer = {
            k: row[k]
            for k in ("sentiment", "rating", "confidence", "would_recommend", "aspects", "summary")
        }
        model.model_validate(answer, strict=True)

    check_rows(ran.rows("structured_json"), ran.source("reviews.jsonl"), check)


def test_images_were_sent(ran: Ran) -> None:
    images = ran.root / "examples" / "recipes" / "data" / "images"
    suffixes: set[str] = set()

    def check(row: Row, src: Row) -> None:
        # Resolved against image_base_path: absolute paths of the shipped files.
        paths = [Path(p) for p in row["photos"]]
        assert [p.name for p in paths] == src["photos"]
        assert all(p.is_absolute() and p.parent == images and p.is_file() for p in paths)
        suffixes.update(p.suffix for p in paths)
        assert row["answer"].startswith(
            "echo: Look at the image(s) and answer in one sentence: " + src["question"]
        )
        # The emulator counts IMAGE_TOKENS per image received, plus a few for the short text:
        # exactly len(photos) images went with the prompt.
        tokens = row["__usage__"]["input_tokens"]
        n = len(src["photos"])
        assert IMAGE_TOKENS * n < tokens < IMAGE_TOKENS * (n + 1), (tokens, n)

    source = ran.source("shapes.jsonl")
    assert {len(s["photos"]) for s in source} == {1, 2}  # one image, and several, per row
    check_rows(ran.rows("images"), source, check)
    assert suffixes == {".png", ".jpg"}
    for path in images.iterdir():  # keep the shipped images tiny
        assert path.stat().st_size < 2048, path


def test_custom_function_output(ran: Ran) -> None:
    script = ran.root / "examples" / "recipes" / "custom_function.py"
    spec = importlib.util.spec_from_file_location("recipes_custom_function", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def check(row: Row, src: Row) -> None:
        assert {k: row[k] for k in src} == src  # remove_columns: false keeps the source columns
        assert row["draft"].startswith(
            "echo: Write a short, friendly support reply to " + src["customer"]
        )
        # The function's own result for this row and the LLM's draft: no fallback was used.
        variables = {"customer": src["customer"], "message": src["message"], "draft": row["draft"]}
        assert row["checks"] == module.triage(variables, src)
        assert row["needs_review"] is row["checks"]["needs_review"]

    rows = ran.rows("custom_function")
    check_rows(rows, ran.source("tickets.jsonl"), check)
    by_id = {row["id"]: row["checks"] for row in rows}
    assert by_id["t3"]["risky_words"] == ["refund"]  # the echoed draft repeats the ticket
    assert by_id["t1"]["needs_review"] and not by_id["t2"]["needs_review"]


@pytest.mark.parametrize("name", RECIPES)
def test_check_reports_the_shard_done(ran: Ran, name: str) -> None:
    command = [str(MMIRAGE)] if MMIRAGE.exists() else [sys.executable, "-m", "mmirage"]
    # The config as the run read it: the base URL is part of what decides its rows.
    (url,) = [ln.split("=", 1)[1] for ln in ran.stdout.splitlines() if ln.startswith("OPENAI_BASE")]
    done = subprocess.run(
        [*command, "check", f"examples/recipes/{name}.yaml"],
        cwd=ran.root,
        env={**os.environ, "OPENAI_BASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 shard(s): 1 success" in done.stdout
    elsewhere = subprocess.run(
        [*command, "check", f"examples/recipes/{name}.yaml"],
        cwd=ran.root,
        env={**os.environ, "OPENAI_BASE_URL": "http://127.0.0.1:9/v1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert elsewhere.returncode == 1 and "1 outdated" in elsewhere.stdout  # another server


def test_run_one_recipe_by_name(tmp_path: Path) -> None:
    copy_recipes(tmp_path)
    done = run_script(tmp_path, "openai_compatible")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "out" / "recipes" / "openai_compatible").is_dir()
    assert not (tmp_path / "out" / "recipes" / "images").exists()
    bad = run_script(tmp_path, "no_such_recipe")
    assert bad.returncode == 2 and "unknown recipe" in bad.stderr


def test_custom_function_fallback(tmp_path: Path, emulator: Any) -> None:
    """What the recipe's comments promise when the function raises: that row gets the
    configured fallback_value and an error naming why; the other rows are unaffected."""
    copy_recipes(tmp_path)
    script = tmp_path / "examples" / "recipes" / "custom_function.py"
    script.write_text(
        script.read_text()
        + "\n\n_triage = triage\n\n\n"
        + "def triage(variables, row):\n"
        + "    if row['id'] == 't2':\n"
        + "        raise RuntimeError('no rule for this ticket')\n"
        + "    return _triage(variables, row)\n"
    )
    env = {
        **os.environ,
        "OPENAI_BASE_URL": emulator.openai_base_url,
        "OPENAI_API_KEY": "sk-recipes-test",
    }
    command = [str(MMIRAGE)] if MMIRAGE.exists() else [sys.executable, "-m", "mmirage"]
    done = subprocess.run(
        [*command, "run", "examples/recipes/custom_function.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # a fallback row counts as failed
    assert "1 row(s) failed" in done.stderr
    config = load_mmirage_config(RECIPES_DIR / "custom_function.yaml", env={})
    (custom,) = [p for p in config.processors if isinstance(p, CustomProcessorConfig)]
    rows = {
        r["id"]: r
        for r in read_jsonl(tmp_path / "out/recipes/custom_function/data/shard-0-of-1.jsonl")
    }
    assert rows["t2"]["checks"] == custom.fallback_value
    assert rows["t2"]["needs_review"] is True  # the fallback sends the draft to a human
    assert "no rule for this ticket" in rows["t2"]["__errors__"]["checks"]
    assert "fallback_value used" in rows["t2"]["__errors__"]["checks"]
    assert all(r["__errors__"] is None for k, r in rows.items() if k != "t2")
