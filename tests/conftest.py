from __future__ import annotations

from collections.abc import Iterator

import pytest

from llm_kit.emulator import EmulatorConfig, running_emulator

TEST_KEY = "sk-test-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def emulator() -> Iterator[object]:
    """A plain emulator (echo responder, no faults) on a random free port."""
    with running_emulator(EmulatorConfig()) as emu:
        yield emu


@pytest.fixture(autouse=True)
def _no_real_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's real keys."""
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
