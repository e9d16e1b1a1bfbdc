"""``python -m provider_emulator``: serve the provider emulator until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import sys

from provider_emulator.config import (
    BATCH_OPTIONS,
    DIALECTS,
    INVALID_JSON,
    KEY_REFUSALS,
    RESPONDERS,
    EmulatorConfig,
)
from provider_emulator.runner import ready_line
from provider_emulator.server import serve


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m provider_emulator",
        description="Serve the OpenAI, Anthropic and Gemini live and batch APIs locally.",
    )
    add = parser.add_argument
    add("--host", default="127.0.0.1")
    add("--port", type=int, default=8000, help="0 picks a free port")
    add("--latency", type=float, help="seconds added to every answer")
    add("--latency-jitter", type=float, help="up to this many extra seconds, at random")
    add("--rpm", type=int, help="requests per minute per provider family")
    add("--tpm", type=int, help="tokens per minute per provider family")
    for code in ("429", "500", "503", "529"):
        add(f"--fault-{code}", type=float, help=f"share of requests answered {code}")
    add(
        "--fault-429-budget-left",
        type=float,
        help="share answered 429 whose rate-limit headers show budget left (sporadic)",
    )
    add("--fault-reset", type=float, help="share of connections closed without an answer")
    add("--fault-hang", type=float, help="share of requests that hang --hang-seconds")
    add("--fault-insufficient-quota", type=float, help="share answered 429 insufficient_quota")
    add("--hang-seconds", type=float, help="how long a hung request hangs (default 600)")
    add("--retry-after", type=float, help="retry-after of injected 429s (default 1.0)")
    add(
        "--responder",
        choices=RESPONDERS,
        help="echo (default), local (embedded model), verbatim (the prompt itself) or escapes "
        "(the prompt with its \\uXXXX escapes decoded)",
    )
    add(
        "--dialect",
        choices=DIALECTS,
        help="the OpenAI-compatible server whose structured-output forms /v1/chat/completions "
        "takes (default openai); the others are refused or ignored as that server does",
    )
    add(
        "--model-dialect",
        action="append",
        metavar="MODEL=DIALECT",
        help="this model's own dialect, as behind a gateway that routes per model (repeatable)",
    )
    add("--seed", type=int, help="seed of the fault and jitter draws")
    add("--workers", type=int, help="processes sharing the port (SO_REUSEPORT)")
    add(
        "--record-times",
        action="store_true",
        default=None,
        help="keep admission times in /_emulator/stats",
    )
    add(
        "--invalid-json",
        choices=INVALID_JSON,
        help="JSON answers that miss the requested schema: never (default), first (only before "
        "any assistant turn: a re-ask succeeds) or always",
    )
    add(
        "--record-requests",
        action="store_true",
        default=None,
        help="keep every live request for /_emulator/requests (tests)",
    )
    add("--api-key", help="the one key the OpenAI endpoint accepts (default: any non-empty key)")
    add(
        "--refuse-keys-as",
        choices=KEY_REFUSALS,
        help="how a missing or other key is refused: provider (OpenAI's 401, default) or "
        "litellm (HTTP 500 in plain text without a key, 400 'No connected db.' with another)",
    )
    for option in BATCH_OPTIONS:
        flags = [option.flag] + ([option.alias] if option.alias else [])
        add(*flags, dest=option.field, type=option.kind, help=option.help)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    host, port = args.pop("host"), args.pop("port")
    try:
        config = EmulatorConfig.from_options(**args)
    except (TypeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        serve(host, port, config, ready=lambda bound: print(ready_line(host, bound), flush=True))
    except (RuntimeError, OSError) as exc:  # a busy port, the local model missing, ...
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
