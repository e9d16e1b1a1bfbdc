"""What a user sees while a run goes, through the real CLI against the emulator, with stderr a
file or a pipe as in a SLURM task's log: a progress line every
``progress_interval_seconds`` before the end (rows, rate, ETA, failed, retried, rate-limited,
tokens, cost), each shard's retries by cause in its summary line and in ``stats``, each retry
at DEBUG, and one total line with an ETA for parallel shards."""

from __future__ import annotations

import json
import logging
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_kit.ratelimit import RateLimiter
from provider_emulator import EmulatorConfig, Faults, running_emulator

KEY = "sk-progress-lines"
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
COUNTERS = (
    r"(\d+)/(\d+) rows \(\d+%\), [\d.,]+ rows/s, ETA (\S+), (\d+) failed, (\d+) retried, "
    r"(\d+) rate-limited, tokens (\d+) in / (\d+) out, cost ~\$[\d.]+"
)
SUMMARY = re.compile(
    r"shard 0/1: requests retried: (\d+) \(429: (\d+), 5xx: (\d+), timeout: (\d+), "
    r"connection: (\d+)\); ([\d.]+) s cooling down after rate limits; tokens (\d+) in / (\d+) "
    r"out, cost ~\$[\d.]+ at list prices"
)


def pipeline(root: Path, base_url: str, rows: int, **options: Any) -> Path:
    """One live output over ``rows`` rows, a priced model (the emulator answers any name)."""
    data = root / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(rows)))
    execution = {"progress_interval_seconds": 0.2, **options.pop("execution", {})}
    config = {
        "processors": [
            {
                "type": "llm",
                "base_url": base_url,
                "model": "gpt-4o-mini",
                "worker_concurrency": 1,
                **options,
            }
        ],
        "loading_params": {
            "state_dir": str(root / "state"),
            "num_shards": execution.get("local_parallel_shards", 1),
            "datasets": [{"path": str(data), "type": "JSONL", "output_dir": str(root / "out")}],
            "output_format": "jsonl",
        },
        "processing_params": {
            "inputs": [{"name": "id", "key": "id"}],
            "outputs": [{"name": "answer", "type": "llm", "prompt": "Say {{ id }}"}],
            "output_schema": {"id": "{{ id }}", "answer": "{{ answer }}"},
        },
        "execution_params": execution,
    }
    path = root / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def logged_run(root: Path, *args: str) -> tuple[int, str, str]:
    """``mmirage ARGS`` with stderr into a file, as ``> log 2>&1`` or a SLURM task's log:
    (exit code, stdout, the log)."""
    log = root / "run.log"
    env = {**os.environ, "OPENAI_API_KEY": KEY, "XDG_CACHE_HOME": str(root / "cache")}
    env.pop("MMIRAGE_PROGRESS", None)
    with log.open("w") as err:
        done = subprocess.run(
            [sys.executable, "-m", "mmirage", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=300,
            env=env,
            cwd=root,
        )
    return done.returncode, done.stdout, log.read_text()


def test_a_log_gets_progress_lines_with_the_counters_before_the_end(tmp_path: Path) -> None:
    # 60 rows one at a time, 50 ms each: the run lasts several progress intervals.
    with running_emulator(EmulatorConfig(latency_s=0.05)) as emu:
        config = pipeline(tmp_path, emu.openai_base_url, 60)
        code, _, log = logged_run(tmp_path, "run", str(config))
    assert code == 0, log
    lines = log.splitlines()
    progress = [
        (i, m) for i, line in enumerate(lines) if (m := re.fullmatch(
            rf"{STAMP} shard 0 · dataset 0: {COUNTERS}", line
        ))
    ]  # fmt: skip
    end = next(i for i, line in enumerate(lines) if line.startswith("shard 0/1: done"))
    assert progress, log
    assert all(i < end for i, _ in progress)
    done = [int(m[1]) for _, m in progress]
    assert done == sorted(done) and done[0] < 60  # before the end, counting up
    assert {int(m[2]) for _, m in progress} == {60}
    assert any(m[3] != "?" for _, m in progress)  # an ETA once rows are done
    # Tokens and cost so far: every answered request counted.
    assert int(progress[-1][1][7]) > 0 and int(progress[-1][1][8]) > 0


def test_retries_by_cause_are_in_the_summary_in_stats_and_each_at_debug(tmp_path: Path) -> None:
    faults = Faults(
        rate_429=0.15, rate_500=0.1, rate_503=0.05, rate_reset=0.05, rate_hang=0.03, hang_s=120,
        retry_after_s=0.0,
    )  # fmt: skip
    with running_emulator(EmulatorConfig(faults=faults, seed=7)) as emu:
        config = pipeline(
            tmp_path, emu.openai_base_url, 40, worker_concurrency=4, max_retries=40,
            request_timeout=3.0,  # far above an answer's time, even on a loaded machine
        )  # fmt: skip
        code, out, log = logged_run(tmp_path, "--log-level", "DEBUG", "run", str(config), "--stats")
        served = emu.stats()
    assert code == 0, log[-3000:]
    status = served["status"]
    # Every failure was retried (max_retries is ample); a hung request never got its answer.
    expected = {
        "429": status.get("429", 0),
        "5xx": status.get("500", 0) + status.get("503", 0),
        "timeout": served["requests"] - sum(status.values()),
        "connection": status.get("reset", 0),
        "other": 0,
    }
    assert all(n for cause, n in expected.items() if cause != "other"), served
    retried = sum(expected.values())

    summary = SUMMARY.search(log)
    assert summary, log[-3000:]
    assert [int(summary[k]) for k in range(1, 6)] == [
        retried, expected["429"], expected["5xx"], expected["timeout"], expected["connection"],
    ]  # fmt: skip

    stats = json.loads(out)
    assert stats["per_shard"][0]["requests"]["retries"] == expected
    aggregate = stats["aggregate"]["requests"]
    assert aggregate["retries"] == expected
    assert aggregate["cost_usd"] > 0 and aggregate["cooldown_seconds"] >= 0

    # DEBUG: one line per retry, with its cause, attempt and delay.
    debug = re.findall(
        r"DEBUG llm_kit\.retries: retry of 0::\d+:answer in [\d.]+ s: attempt (\d+) failed "
        r"\((429|5xx|timeout|connection)\)",
        log,
    )
    assert len(debug) == retried
    assert {cause: sum(c == cause for _, c in debug) for cause in expected if cause != "other"} == {
        k: v for k, v in expected.items() if k != "other"
    }

    # `mmirage stats` reads the same from the shard's status.
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    shown = subprocess.run(
        [sys.executable, "-m", "mmirage", "stats", str(config)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["per_shard"][0]["stats"]["requests"]["retries"] == expected
    assert report["aggregate"]["requests"]["retries"] == expected
    assert report["aggregate"]["requests"]["cost_usd"] == aggregate["cost_usd"]


def test_parallel_shards_log_one_total_line_with_an_eta(tmp_path: Path) -> None:
    # Three shards of 40 rows at once, one request at a time each: every child runs for
    # longer than its once-a-second record, and the parent logs every 0.2 s.
    with running_emulator(EmulatorConfig(latency_s=0.05)) as emu:
        config = pipeline(
            tmp_path, emu.openai_base_url, 120, execution={"local_parallel_shards": 3}
        )
        code, _, log = logged_run(tmp_path, "run", str(config))
    assert code == 0, log
    totals = re.findall(
        rf"^{STAMP} total: {COUNTERS} \| shards: \d+ done, \d+ failed, \d+ running, \d+ waiting$",
        log,
        re.MULTILINE,
    )
    assert totals, log
    assert {int(t[1]) for t in totals} == {120}  # the whole run's rows, not one shard's
    assert any(t[2][0].isdigit() for t in totals)  # an ETA
    done = [int(t[0]) for t in totals]
    assert done == sorted(done) and done[0] < 120
    # The children's records feed the total and are not relayed; nor is a line per shard.
    assert "mmirage-progress" not in log and "· dataset" not in log
    for k in range(3):
        assert re.search(rf"^\[shard {k}\] shard {k}/3: requests retried: 0 ", log, re.MULTILINE)


def terminal_run(root: Path, *args: str) -> tuple[int, str]:
    """``mmirage ARGS`` with stderr a terminal (a pseudo-terminal 100 columns wide): (exit
    code, what the terminal got, escape sequences removed)."""
    env = {**os.environ, "OPENAI_API_KEY": KEY, "XDG_CACHE_HOME": str(root / "cache")}
    env.update(COLUMNS="100", TERM="xterm")
    env.pop("MMIRAGE_PROGRESS", None)
    main, side = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mmirage", *args],
        stdout=subprocess.DEVNULL, stderr=side, env=env, cwd=root,
    )  # fmt: skip
    os.close(side)
    got = b""
    try:
        while True:
            ready, _, _ = select.select([main], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the terminal's other side closed: the run ended
                break
            if not chunk:
                break
            got += chunk
    finally:
        os.close(main)
    code = proc.wait(timeout=120)
    return code, re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", got.decode("utf-8", "replace"))


def test_a_terminal_gets_a_bar_with_the_same_counters(tmp_path: Path) -> None:
    faults = Faults(rate_429=0.2, retry_after_s=0.0)
    with running_emulator(EmulatorConfig(latency_s=0.02, faults=faults, seed=5)) as emu:
        config = pipeline(tmp_path, emu.openai_base_url, 30, max_retries=30)
        code, screen = terminal_run(tmp_path, "run", str(config))
    assert code == 0, screen
    assert re.search(r"shard 0 · dataset 0 .*30/30 0 failed .* ETA", screen), screen
    # The request counters, on the line below the bar.
    assert re.search(
        r"\d+ retried, \d+ rate-limited, tokens \d+ in / \d+ out, cost ~\$[\d.]+", screen
    ), screen
    assert not re.search(rf"{STAMP} shard 0 · dataset 0:", screen)  # no log lines


def test_a_pool_wide_cool_down_is_logged_once_with_the_limits_and_counted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = RateLimiter(rpm=600)
    with caplog.at_level(logging.INFO, logger="llm_kit.ratelimit"):
        limiter.cool_down(2.0)
        limiter.cool_down(1.0)  # within the first pause: neither a new pause nor more time
    assert [r.getMessage() for r in caplog.records] == [
        "rate limited: every request waits 2.00 s (limits now: 600 requests/min)"
    ]
    assert limiter.cooled_down_seconds == pytest.approx(2.0)


def test_parallel_shards_say_a_stale_price_once(tmp_path: Path) -> None:
    """Each shard child used to warn of an old price table in turn: the parent says it once."""
    prices = tmp_path / "old.json"
    table = {"models": {"gpt-4o-mini": {"input": 0.15, "output": 0.6, "date": "2020-01-01"}}}
    prices.write_text(json.dumps(table))
    with running_emulator(EmulatorConfig()) as emu:
        config = pipeline(tmp_path, emu.openai_base_url, 12, execution={"local_parallel_shards": 3})
        os.environ["MMIRAGE_PRICES"] = str(prices)
        try:
            code, _, log = logged_run(tmp_path, "run", str(config))
        finally:
            del os.environ["MMIRAGE_PRICES"]
    assert code == 0, log
    assert log.count("over 6 months ago") == 1, log
    assert "[shard" not in next(line for line in log.splitlines() if "over 6 months" in line)
