"""The command line's conventions: ``--version``, ``--log-level`` before or after the
subcommand, Ctrl-C exit 130, ``check``/``stats`` of a pipeline that never ran, an empty input
file, ``retry``'s one form, and merged batch rows that carry their tokens once."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from importlib.metadata import version
from pathlib import Path

from batch_spec_support import MMIRAGE, REPO, cli_env, mmirage, read_jsonl
from provider_emulator import EmulatorConfig, running_emulator
from test_attack_batch_files import KEY, pipeline
from test_retry_cli import cli_config


def test_version_names_the_installed_distribution() -> None:
    shown = mmirage("--version", env=cli_env())
    # ... and that it is this project, and where from: `mmirage` on PyPI is another one.
    expected = f"mmirage {version('mmirage')} (MMIRAGE + llm_kit, from "
    assert shown.code == 0 and shown.out.startswith(expected), str(shown)


def test_log_level_is_taken_after_the_subcommand_too(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    plain = mmirage("check", missing, env=cli_env())
    before = mmirage("--log-level", "DEBUG", "check", missing, env=cli_env())
    after = mmirage("check", missing, "--log-level", "DEBUG", env=cli_env())
    assert plain.code == before.code == after.code == 2
    assert "Traceback" not in plain.err  # DEBUG alone shows the traceback of an error
    assert "Traceback" in before.err and "Traceback" in after.err, str(after)
    nested = mmirage("job", "status", tmp_path / "job.json", "--log-level", "DEBUG", env=cli_env())
    assert "no such option" not in nested.err, str(nested)  # a group's commands take it too


def test_ctrl_c_while_a_command_waits_exits_130(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig(batch_delay_s=600)) as emu:
        config = pipeline(tmp_path, emu)
        env = cli_env(OPENAI_API_KEY=KEY)
        assert mmirage("run", config, env=env).code == 0
        waiting = subprocess.Popen(
            [MMIRAGE, "check", str(config), "--wait"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            time.sleep(2)  # polling by now; were it not, the interrupt ends it all the same
            waiting.send_signal(signal.SIGINT)
            out, err = waiting.communicate(timeout=60)
        finally:
            waiting.kill()
    assert waiting.returncode == 130, out + err  # the shell's 128 + SIGINT, not 1
    assert "error: interrupted; what finished is kept" in err and "Traceback" not in err


def test_check_and_stats_of_a_pipeline_that_never_ran_say_so(tmp_path: Path) -> None:
    config = cli_config(tmp_path)
    never = f"no shard of this pipeline has run yet: 'mmirage run {config}' starts it"
    check = mmirage("check", config, env=cli_env())
    assert check.code == 1 and never in check.err, str(check)
    stats = mmirage("stats", config, env=cli_env())
    assert stats.code == 1 and stats.err.strip() == f"error: {never}", str(stats)  # was exit 0
    assert stats.out == ""
    assert mmirage("run", config, env=cli_env()).code == 0
    ran = mmirage("stats", config, env=cli_env())
    assert ran.code == 0 and json.loads(ran.out)["aggregate"]["completed_shards"] == 2


def test_an_empty_input_file_is_named_once(tmp_path: Path) -> None:
    config = cli_config(tmp_path, rows=0, num_shards=3)
    ran = mmirage("run", config, env=cli_env())
    assert ran.code == 0, str(ran)
    warned = [line for line in ran.err.splitlines() if "holds no rows" in line]
    assert len(warned) == 1 and str(tmp_path / "in.jsonl") in warned[0], ran.err


def test_retry_prints_one_form(tmp_path: Path) -> None:
    config = cli_config(tmp_path)
    assert mmirage("run", config, env=cli_env()).code == 0
    retried = mmirage("retry", config, env=cli_env())
    assert retried.code == 0 and retried.err == "", str(retried)  # was a sentence as well
    assert json.loads(retried.out)["successful"] == 2


def test_merged_batch_rows_carry_their_tokens_once(tmp_path: Path) -> None:
    with running_emulator(EmulatorConfig()) as emu:
        config = pipeline(tmp_path, emu)
        env = cli_env(OPENAI_API_KEY=KEY)
        assert mmirage("run", config, env=env).code == 0
        out = tmp_path / "merged.jsonl"
        assert mmirage("merge", config, "--output-path", out, env=env).code == 0
    for row in read_jsonl(out):
        assert "__usage__" not in row, row  # was {"input_tokens", "output_tokens"} as well
        assert row["input_tokens"] > 0 and row["output_tokens"] > 0
