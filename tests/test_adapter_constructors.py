"""Custom batch adapters as users write them: with a constructor of their own (no argument, as
the original's ``RecordingAdapter`` test double has; with options that have defaults; one that
never calls the base constructor), each runs a pipeline end to end (run, check, merge) through
the plain CLI against the emulator. One that cannot be built is exit 2 in one sentence naming
the class; ``status_words`` extends the words ``_normalize_status`` knows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from batch_spec_support import mmirage, read_jsonl
from mmirage.core.process.batch.adapter import (
    IN_PROGRESS,
    STATUS_WORDS,
    UNKNOWN,
    BatchSubmissionAdapter,
)
from provider_emulator import EmulatorConfig, running_emulator
from provider_emulator.runner import EmulatorHandle
from test_batch_spec import QUESTIONS, check_complete, mistral_setup, ok

ADAPTERS = """
from batch_spec_support import MistralBatchAdapter, MistralBatchConfig
from mmirage.core.process.batch.provider_resolution import BatchProviderConfigRegistry
from mmirage.core.process.batch.registry import BatchAdapterRegistry


class RecordingAdapter(MistralBatchAdapter):  # the original's test double: no argument
    def __init__(self):
        super().__init__()
        self.submitted = []


class WithOptions(MistralBatchAdapter):
    def __init__(self, poll_every: float = 1.0, *, label: str = "acme"):
        super().__init__()
        self.poll_every, self.label = poll_every, label


class SkipsTheBase(MistralBatchAdapter):  # never calls BatchSubmissionAdapter.__init__
    def __init__(self):
        self.submitted = []


class NeedsRegion(MistralBatchAdapter):
    def __init__(self, region):
        super().__init__()


class Breaks(MistralBatchAdapter):
    def __init__(self):
        raise RuntimeError("no license file")


BatchProviderConfigRegistry.register("mistral", MistralBatchConfig)
BatchAdapterRegistry.register("mistral", {name})
"""


@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorHandle]:
    with running_emulator(EmulatorConfig(), subprocess=True) as handle:
        yield handle


def setup(tmp_path: Path, emu: EmulatorHandle, adapter: str) -> tuple[Path, dict[str, str]]:
    made, env = mistral_setup(tmp_path, emu)
    (tmp_path / "plugins" / "acme_adapters.py").write_text(ADAPTERS.replace("{name}", adapter))
    env["MMIRAGE_BATCH_PROVIDERS"] = "acme_adapters"
    return made.config, env


@pytest.mark.parametrize("adapter", ["RecordingAdapter", "WithOptions", "SkipsTheBase"])
def test_an_adapter_with_its_own_constructor_runs_end_to_end(
    adapter: str, emu: EmulatorHandle, tmp_path: Path
) -> None:
    config, env = setup(tmp_path, emu, adapter)
    # Before: TypeError (takes 1 positional argument but 2 were given) or AttributeError.
    ok(mmirage("run", "--config", config, env=env))
    assert "completed" in ok(mmirage("check", "--config", config, env=env)).out
    merged = tmp_path / "merged.jsonl"
    ok(mmirage("merge", "--config", config, "--output-path", merged, env=env))
    check_complete(read_jsonl(merged), QUESTIONS)


@pytest.mark.parametrize(
    ("adapter", "says"),
    [
        ("NeedsRegion", "its constructor needs region; give it a default"),
        ("Breaks", "failed to build (RuntimeError: no license file); fix its constructor"),
    ],
)
def test_an_adapter_that_cannot_be_built_is_one_sentence_exit_2(
    adapter: str, says: str, emu: EmulatorHandle, tmp_path: Path
) -> None:
    config, env = setup(tmp_path, emu, adapter)
    dry_run = ("run", "--config", config, "--export-prompts", tmp_path / "prompts")
    for command in (("run", "--config", config), dry_run):
        refused = mmirage(*command, env=env)
        assert refused.code == 2, str(refused)
        assert f"the batch adapter {adapter} of provider 'mistral'" in refused.err, str(refused)
        assert says in refused.err and "Traceback" not in refused.err, str(refused)


def test_status_words_extend_the_normalized_statuses() -> None:
    class Warming(BatchSubmissionAdapter):
        status_words: ClassVar[dict[str, str]] = {**STATUS_WORDS, "warming_up": IN_PROGRESS}

    assert Warming._normalize_status(" Warming_Up ") == IN_PROGRESS
    assert Warming._normalize_status("completed") == "completed"
    assert BatchSubmissionAdapter._normalize_status("warming_up") == UNKNOWN
