"""Helpers of ``test_batch_spec.py``: the real ``mmirage`` command line in a subprocess, a pool
of emulators (each in its own process), readers for shards, receipts and merged files, and the
spec page's custom provider (``MistralBatchConfig`` / ``MistralBatchAdapter``) with its
``...`` bodies filled in by a client of the emulator's OpenAI batch endpoints."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from mmirage.config.batch_provider import BatchProviderConfig
from mmirage.core.process.batch.adapter import BatchSubmissionAdapter, BatchSubmissionResult
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
MMIRAGE = str(Path(sys.executable).with_name("mmirage"))
PLACEHOLDER = "__BATCH_SUBMITTED__:"
RUN_ID = re.compile(r"^[0-9a-f]{6}$")
# Variables the CLI reads that must come from each test only, never from the developer's shell
# (PYTHONPATH stays: it names the sources under test, e.g. a git worktree's).
_PRIVATE_ENV = re.compile(
    r"^(OPENAI|ANTHROPIC|GEMINI|GOOGLE|MISTRAL)_(API_KEY|BASE_URL)$|^MMIRAGE_"
)


# -- the command line ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Cli:
    """One finished ``mmirage`` command."""

    argv: tuple[str, ...]
    code: int
    out: str
    err: str
    seconds: float

    def __str__(self) -> str:
        return (
            f"mmirage {' '.join(self.argv)} -> exit {self.code}\n--- stdout\n{self.out}"
            f"--- stderr\n{self.err}"
        )

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error: ")]


def cli_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any key, base URL or MMIRAGE_* variable, plus
    ``extra`` (so every key a command sees was given by its test)."""
    env = {k: v for k, v in os.environ.items() if not _PRIVATE_ENV.match(k)}
    inherited = os.environ.get("PYTHONPATH")
    if inherited and "PYTHONPATH" in extra:
        # A test's own entries go first; the inherited ones (a checkout's sources) stay, so
        # the CLI runs the code under test, not an installed copy.
        extra = {**extra, "PYTHONPATH": f"{extra['PYTHONPATH']}{os.pathsep}{inherited}"}
    env.update(extra)
    return env


def mmirage(*argv: str | Path, env: Mapping[str, str], timeout: float = 120) -> Cli:
    """``mmirage ARGV...`` from the repository root (the spec's configs use relative paths)."""
    args = tuple(str(a) for a in argv)
    started = time.monotonic()
    done = subprocess.run(
        [MMIRAGE, *args],
        cwd=REPO,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Cli(args, done.returncode, done.stdout, done.stderr, time.monotonic() - started)


# -- emulators ----------------------------------------------------------------------------------


EMULATORS: dict[str, EmulatorConfig] = {
    "clean": EmulatorConfig(seed=5),
    # Batches take 4 s: `run` must be back well before, `--wait` must see them end.
    "slow": EmulatorConfig(seed=6, batch_delay_s=4.0),
    # Batches take 40 s: a `check` right after `run` sees them running even on a busy machine,
    # where starting the two CLI processes alone has taken 9 s.
    "paced": EmulatorConfig(seed=6, batch_delay_s=40.0),
    # A share of the batches fail or expire as a whole, a share of the requests error.
    "faulty": EmulatorConfig(
        seed=7, batch_failure_rate=0.25, batch_expire_rate=0.25, batch_item_error_rate=0.2
    ),
    "item_errors": EmulatorConfig(seed=8, batch_item_error_rate=0.5),
    "failing": EmulatorConfig(seed=9, batch_failure_rate=1.0),
}


@dataclass
class Emulators:
    """Emulators started on first use, each in its own process, stopped with the module."""

    stack: contextlib.ExitStack
    started: dict[str, EmulatorHandle] = field(default_factory=dict)

    def __getitem__(self, name: str) -> EmulatorHandle:
        if name not in self.started:
            self.started[name] = self.stack.enter_context(
                running_emulator(EMULATORS[name], subprocess=True)
            )
        return self.started[name]


def batches_created(emu: EmulatorHandle, provider: str = "openai") -> int:
    return int(emu.stats()["batches"].get(provider, 0))


# -- files --------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def write_yaml(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def write_rows(path: Path, rows: Sequence[Mapping[str, Any]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(dict(row)) + "\n" for row in rows))
    return str(path)


def shard_rows(output_dir: Path) -> list[dict[str, Any]]:
    """The published rows of one dataset, shard after shard: JSONL shard files, or the HF
    directories of the default format (read with ``datasets``, not with mmirage)."""
    files = sorted(output_dir.glob("shard-*-of-*.jsonl"))
    if files:
        return [row for path in files for row in read_jsonl(path)]
    directories = sorted(p for p in output_dir.glob("shard-*-of-*") if p.is_dir())
    if not directories:
        return []
    import datasets

    return [dict(row) for d in directories for row in datasets.load_from_disk(str(d))]


def receipt_files(base: Path, modality: str = "*") -> list[Path]:
    """Real (not dry-run) receipts ``<base minus .jsonl>.<modality>.<run_id>.jsonl``."""
    stem = str(base).removesuffix(".jsonl")
    found = Path(stem).parent.glob(f"{Path(stem).name}.{modality}.*.jsonl")
    return sorted(p for p in found if ".dry-run." not in p.name)


def receipt_lines(paths: Sequence[Path]) -> list[dict[str, Any]]:
    return [line for path in paths for line in read_jsonl(path)]


def receipt_ids(lines: Sequence[Mapping[str, Any]]) -> list[str]:
    return [cid for line in lines for cid in line["custom_id_to_source_index"]]


def request_totals(out: str) -> dict[str, int]:
    """The merge's ``requests: N (a succeeded, b failed, ...)`` line as numbers."""
    line = next(line for line in out.splitlines() if line.startswith("requests: "))
    totals = {"total": int(line.split()[1])}
    for count, word in re.findall(r"(\d+) ([a-z]+(?: running)?)", line.split("(", 1)[1]):
        totals[word.replace("still ", "")] = int(count)
    return totals


def incomplete_rows(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    return [i for i, row in enumerate(rows) if row.get("__errors__")]


# -- the spec's custom provider -------------------------------------------------------------------

CHAT = "/v1/chat/completions"
MISTRAL_BASE_URL = "MISTRAL_BASE_URL"  # where the example adapter sends its calls


@dataclass
class MistralBatchConfig(BatchProviderConfig):
    provider: str = "mistral"
    model: str = "mistral-small-latest"


class MistralBatchAdapter(BatchSubmissionAdapter):
    """The spec's adapter; its provider is the emulator's OpenAI-compatible batch API."""

    required_credentials = ("api_key",)

    def _client(self) -> Any:
        import openai

        return openai.OpenAI(
            base_url=os.environ[MISTRAL_BASE_URL],
            api_key=self.credentials["api_key"],
            max_retries=0,
        )

    def build_request(
        self, custom_id: str, payload: dict[str, Any], config: BatchProviderConfig
    ) -> dict[str, Any]:
        assert isinstance(config, MistralBatchConfig)
        return {
            "custom_id": custom_id,
            "params": {"model": config.model, "messages": payload["messages"]},
        }

    def estimate_request_bytes(self, request: dict[str, Any]) -> int:
        return len(json.dumps(request).encode("utf-8"))

    def submit_chunk(
        self, chunk_id: str, requests: Sequence[dict[str, Any]], config: BatchProviderConfig
    ) -> dict[str, Any]:
        lines = b"".join(
            orjson.dumps(
                {"custom_id": r["custom_id"], "method": "POST", "url": CHAT, "body": r["params"]}
            )
            + b"\n"
            for r in requests
        )
        client = self._client()
        uploaded = client.files.create(file=(f"{chunk_id}.jsonl", lines), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint=CHAT,
            completion_window="24h",
            metadata={"chunk_id": chunk_id},
        )
        return {"id": batch.id, "status": batch.status, "chunk_id": chunk_id}

    def parse_submission_result(self, raw_result: dict[str, Any]) -> BatchSubmissionResult:
        return BatchSubmissionResult(
            provider_batch_id=raw_result["id"],
            status=self._normalize_status(raw_result["status"]),
            raw_response=raw_result,
        )

    def check_batch_status(
        self, provider_batch_id: str, config: BatchProviderConfig
    ) -> BatchSubmissionResult:
        batch = self._client().batches.retrieve(provider_batch_id)
        return self.parse_submission_result({"id": batch.id, "status": batch.status})

    def retrieve_results(
        self, provider_batch_id: str, config: BatchProviderConfig
    ) -> Sequence[dict[str, Any]]:
        client = self._client()
        batch = client.batches.retrieve(provider_batch_id)
        rows: list[dict[str, Any]] = []
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id:
                for line in client.files.content(file_id).text.splitlines():
                    if line.strip():
                        rows.append(_mistral_row(json.loads(line)))
        return rows


def _mistral_row(line: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI batch output line → the contract's result row."""
    row: dict[str, Any] = {"custom_id": line["custom_id"]}
    response = line.get("response") or {}
    body = response.get("body") or {}
    if response.get("status_code") == 200:
        row.update(status="succeeded", generated_text=body["choices"][0]["message"]["content"])
        usage = body.get("usage")
        if usage:
            row.update(
                input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]
            )
        return row
    error = body.get("error") or line.get("error") or {}
    row.update(status="error", error_message=error.get("message") or "failed")
    return row


def register_mistral() -> None:
    """The spec's "Registry Integration" block, at the documented import paths."""
    from mmirage.core.process.batch.provider_resolution import BatchProviderConfigRegistry
    from mmirage.core.process.batch.registry import BatchAdapterRegistry

    BatchProviderConfigRegistry.register("mistral", MistralBatchConfig)
    BatchAdapterRegistry.register("mistral", MistralBatchAdapter)
