"""``mmirage emulate``: the provider emulator (``provider_emulator``) as a local server."""

from __future__ import annotations

import click


def _rate(name: str, what: str, default: str = "0") -> click.Option:
    return click.Option(
        [f"--{name}"],
        type=click.FloatRange(0.0, 1.0),
        default=None,
        help=f"Share of {what} [default: {default}].",
    )


# Declared once as a list so that the command reads like its --help.
_EMULATE_FAULT_OPTIONS = [
    _rate("fault-429", "requests answered 429 with retry-after"),
    _rate(
        "fault-429-budget-left",
        "requests answered 429 whose rate-limit headers show budget left (sporadic)",
    ),
    _rate("fault-500", "requests answered 500"),
    _rate("fault-503", "requests answered 503"),
    _rate("fault-529", "requests answered 529 (overloaded)"),
    _rate("fault-reset", "connections closed without an answer"),
    _rate("fault-hang", "requests that hang --hang-seconds"),
    _rate("fault-insufficient-quota", "requests answered 429 insufficient_quota"),
]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to listen on (0: a free one).",
)
@click.option(
    "--latency",
    type=click.FloatRange(min=0),
    default=None,
    help="Seconds added to every answer [default: 0].",
)
@click.option(
    "--latency-jitter",
    type=click.FloatRange(min=0),
    default=None,
    help="Up to this many extra seconds, at random [default: 0].",
)
@click.option(
    "--rpm",
    type=click.IntRange(min=1),
    default=None,
    help="Requests per minute per provider; 429 beyond [default: no limit].",
)
@click.option(
    "--tpm",
    type=click.IntRange(min=1),
    default=None,
    help="Tokens per minute per provider; 429 beyond [default: no limit].",
)
@click.option(
    "--hang-seconds",
    type=click.FloatRange(min=0),
    default=None,
    help="How long a hung request hangs [default: 600].",
)
@click.option(
    "--retry-after",
    type=click.FloatRange(min=0),
    default=None,
    help="retry-after of injected 429s, seconds [default: 1].",
)
@click.option(
    "--responder",
    type=click.Choice(["echo", "local", "verbatim", "escapes"]),
    default="echo",
    show_default=True,
    help="echo: deterministic, schema-valid; local: embedded model; verbatim: the prompt itself; "
    "escapes: the prompt with its \\uXXXX escapes decoded.",
)
@click.option(
    "--dialect",
    # The emulator's DIALECTS, spelled out: importing llm_kit here would slow every command.
    type=click.Choice(
        ["openai", "vllm", "vllm_legacy", "llama_server", "llama_cpp_python", "ollama", "plain"]
    ),
    default=None,
    help="The OpenAI-compatible server whose structured-output forms the chat endpoint takes "
    "[default: openai]; the others are refused or ignored (HTTP 200) as that server does.",
)
@click.option(
    "--model-dialect",
    multiple=True,
    metavar="MODEL=DIALECT",
    help="A model's own dialect, as behind a gateway that routes each model to its own server "
    "(repeatable).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Seed of the fault and jitter draws [default: new draws each start].",
)
@click.option(
    "--record-times",
    is_flag=True,
    default=None,
    help="Keep admission times in /_emulator/stats.",
)
@click.option(
    "--invalid-json",
    # The emulator's INVALID_JSON, spelled out (see --dialect).
    type=click.Choice(["never", "first", "always"]),
    default=None,
    help="JSON answers that miss the requested schema [default: never]; first: only before "
    "any assistant turn (a re-ask succeeds); always: they never validate.",
)
@click.option(
    "--record-requests",
    is_flag=True,
    default=None,
    help="Keep every live request for /_emulator/requests (tests).",
)
@click.option(
    "--api-key",
    default=None,
    help="The one key the OpenAI endpoint accepts, as a keyed server does [default: any "
    "non-empty key].",
)
@click.option(
    "--refuse-keys-as",
    # The emulator's KEY_REFUSALS, spelled out (see --dialect).
    type=click.Choice(["provider", "litellm"]),
    default=None,
    help="How a missing or other key is refused [default: provider, OpenAI's 401]; litellm: "
    "HTTP 500 in plain text without a key, HTTP 400 'No connected db.' with another.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes sharing the port (SO_REUSEPORT); stats are per process.",
)
def emulate(host: str, port: int, **options: object) -> None:
    """Serve the OpenAI, Anthropic and Gemini APIs locally, until Ctrl-C or SIGTERM."""
    from provider_emulator import EmulatorConfig, ready_line, serve

    try:
        config = EmulatorConfig.from_options(**options)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        serve(host, port, config, ready=lambda bound: click.echo(ready_line(host, bound)))
    except RuntimeError as exc:  # e.g. the local responder without its extra installed
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from None


emulate.params.extend(_EMULATE_FAULT_OPTIONS)

# Batch API knobs. Declared here rather than imported: importing llm_kit slows every command.
_EMULATE_BATCH_OPTIONS = [
    click.Option(
        ["--batch-delay-s", "--batch-delay", "batch_delay_s"],
        type=click.FloatRange(min=0),
        default=None,
        help="Seconds a batch job takes from creation to its end [default: 0, done at once].",
    ),
    _rate("batch-failure-rate", "batch jobs that fail as a whole"),
    _rate("batch-expire-rate", "batch jobs that expire"),
    _rate("batch-expire-done-fraction", "an expiring job's requests that still succeed", "0.5"),
    _rate("batch-item-error-rate", "batch requests that fail one by one"),
    click.Option(
        ["--batch-create-delay-s"],
        type=click.FloatRange(min=0),
        default=None,
        help="Seconds a batch creation's answer comes after the job exists [default: 0].",
    ),
    click.Option(
        ["--batch-damaged-downloads"],
        type=click.IntRange(min=0),
        default=None,
        help="The first N result-file downloads are served damaged: empty, cut off, invalid "
        "UTF-8 [default: 0].",
    ),
    click.Option(
        ["--batch-max-requests"],
        type=click.IntRange(min=1),
        default=None,
        help="Requests per batch, for every provider [default: each provider's own limit].",
    ),
    click.Option(
        ["--batch-max-bytes"],
        type=click.IntRange(min=1),
        default=None,
        help="Bytes per batch, for every provider [default: each provider's own limit].",
    ),
]
emulate.params.extend(_EMULATE_BATCH_OPTIONS)
