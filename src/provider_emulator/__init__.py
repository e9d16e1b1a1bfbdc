"""A local HTTP server that speaks the OpenAI, Anthropic and Gemini live and batch wire formats.

Faithful enough for the official SDKs, fast enough for benchmarks, with configurable latency,
per-minute budgets that answer 429 with real headers, injected faults, and batch jobs (files,
batches, message batches, Gemini batch mode) that end after ``batch_delay_s`` and can fail,
expire or lose single requests on purpose::

    from provider_emulator import EmulatorConfig, Faults, running_emulator

    with running_emulator(EmulatorConfig(faults=Faults(rate_500=0.1), seed=1)) as emu:
        client = openai.OpenAI(base_url=emu.openai_base_url, api_key="test")

From a shell: ``mmirage emulate --port 8000`` or ``python -m provider_emulator --port 8000``.
"""

from provider_emulator.config import EmulatorConfig, Faults
from provider_emulator.runner import EmulatorHandle, emulator_in_loop, ready_line, running_emulator
from provider_emulator.server import create_app, serve

__all__ = [
    "EmulatorConfig",
    "EmulatorHandle",
    "Faults",
    "create_app",
    "emulator_in_loop",
    "ready_line",
    "running_emulator",
    "serve",
]
