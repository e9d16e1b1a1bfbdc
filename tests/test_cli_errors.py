"""One error handler maps every known error to its exit code; one registry maps every
``execution_params.mode`` to its executor."""

from __future__ import annotations

import typing

import pytest

from llm_kit.errors import ConfigError as KitConfigError
from llm_kit.errors import LLMKitError
from mmirage.cli.errors import code_of, exit_code_for, exit_on_errors, user_errors_exit_2
from mmirage.config import ConfigError
from mmirage.core.merge.shards import MergeError
from mmirage.errors import UserError, WorkFailed


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("c.yaml", "processors", "is empty"), 2),
        (UserError("fix it"), 2),
        (KitConfigError("OPENAI_API_KEY is not set"), 2),
        (MergeError("shards missing"), 1),
        (WorkFailed("it failed"), 1),
        (LLMKitError("the provider said no"), 1),
        (ValueError("a bug"), None),
    ],
)
def test_each_error_has_one_exit_code(error: Exception, code: int | None) -> None:
    assert exit_code_for(error) == code


def test_the_handler_prints_one_sentence_and_exits_with_the_code(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped, exit_on_errors():
        raise WorkFailed("2 of 4 shard(s) did not succeed: [1, 3]")
    assert stopped.value.code == 1
    assert capsys.readouterr().err == "error: 2 of 4 shard(s) did not succeed: [1, 3]\n"
    with pytest.raises(ValueError), exit_on_errors():  # a bug is not dressed up as a sentence
        raise ValueError("a bug")


def test_only_user_errors_end_a_shard_run_early() -> None:
    with pytest.raises(SystemExit) as stopped, user_errors_exit_2():
        raise UserError("a missing key")
    assert stopped.value.code == 2
    with pytest.raises(WorkFailed), user_errors_exit_2():  # the caller retries the shard
        raise WorkFailed("a failed attempt")


def test_batch_mode_functions_return_the_code_instead_of_exiting() -> None:
    def failing() -> int:
        raise UserError("no key")

    assert code_of(failing) == 2
    assert code_of(lambda: 0) == 0


def test_every_mode_of_the_config_has_an_executor() -> None:
    from mmirage.config.execution import ExecutionParams
    from mmirage.executors.registry import EXECUTORS

    modes = typing.get_args(typing.get_type_hints(ExecutionParams)["mode"])
    assert set(modes) == set(EXECUTORS)
