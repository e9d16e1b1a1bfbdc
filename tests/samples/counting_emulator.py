"""The llm_kit emulator (echo responder) in its own process, logging every request it gets.

    python counting_emulator.py LOG LATENCY_S

Prints the emulator's ready line once it listens (on a free port). Each chat request appends
two JSON lines to LOG: ``{"ev": "recv", "id", "prompt", "t"}`` when it arrives (before the
latency, so a request whose client is killed while it waits is still counted) and
``{"ev": "done", "id", "t"}`` when its answer is ready. Used by test_kill_resume_cli.py to count
the requests per prompt across runs of ``mmirage run`` that it kills with SIGKILL.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time

import orjson

from provider_emulator import EmulatorConfig, ready_line, serve
from provider_emulator import state as emulator_state
from provider_emulator.responder import EchoResponder, Prompt, Reply


class CountingResponder:
    def __init__(self, log: str, latency_s: float) -> None:
        self.fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.latency_s = latency_s
        self.echo = EchoResponder()
        self.ids = itertools.count()

    def _log(self, entry: dict[str, object]) -> None:
        os.write(self.fd, orjson.dumps(entry, option=orjson.OPT_APPEND_NEWLINE))

    async def respond(self, prompt: Prompt) -> Reply:
        request_id = next(self.ids)
        self._log(
            {"ev": "recv", "id": request_id, "prompt": prompt.last_user_text(), "t": time.time()}
        )
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        reply = await self.echo.respond(prompt)
        self._log({"ev": "done", "id": request_id, "t": time.time()})
        return reply


def main() -> None:
    log, latency_s = sys.argv[1], float(sys.argv[2])
    responder = CountingResponder(log, latency_s)
    # EmulatorState builds its responder through this module-level name.
    emulator_state.make_responder = lambda name: responder
    host = "127.0.0.1"
    serve(host, 0, EmulatorConfig(), ready=lambda port: print(ready_line(host, port), flush=True))


if __name__ == "__main__":
    main()
