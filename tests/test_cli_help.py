"""Help texts name what the code knows: every mode, algorithm, reward, task and family, and the defaults.

The lists are read here from where the code defines them (the enum, the config's Literal types,
BUILTIN_REWARDS), never copied, so a mode or algorithm added without reaching the help fails here.
"""

from __future__ import annotations

from typing import get_args

import pytest
from typer.testing import CliRunner

from spotlight.cli import app
from spotlight.cli_help import choices
from spotlight.config import TrainConfig, TrainSection
from spotlight.models.pipelines.family_config import Family
from spotlight.modes import Mode
from spotlight.rewards.section import BUILTIN_REWARDS
from spotlight.tasks import TaskName


def help_of(*command: str) -> str:
    """``spotlight COMMAND --help`` as one line of words (rich wraps and boxes it to the terminal width)."""
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return " ".join(result.output.replace("│", " ").split())


def test_train_help_names_every_mode_the_default_mode_and_every_reward() -> None:
    text = help_of("train")
    missing = [mode.value for mode in Mode if mode.value not in text]
    assert not missing, f"modes missing from `spotlight train --help`: {missing}"
    assert f"default {TrainConfig.model_fields['mode'].default}" in text
    assert all(name in text for name in BUILTIN_REWARDS)


def test_train_help_names_the_default_algorithm_first_and_the_others() -> None:
    text = help_of("train")
    default = TrainSection.model_fields["algorithm"].default
    assert default == "nft" and "with NFT (default) or Flow-GRPO" in text
    assert len(get_args(TrainSection.model_fields["algorithm"].annotation)) == 2  # a third must be named too
    assert "Flow-GRPO (modes" not in text  # the stale text this replaced


@pytest.mark.parametrize("command,names", [
    (("simulate",), [mode.value for mode in Mode]),
    (("serve-reward",), list(get_args(TaskName))),
    (("make-tiny-pipeline",), list(get_args(Family))),
    ((), ["NFT", "Flow-GRPO"]),
])
def test_every_command_help_lists_the_codes_names(command: tuple[str, ...], names: list[str]) -> None:
    text = help_of(*command)
    assert all(name in text for name in names), (command, [name for name in names if name not in text])


def test_choices_reads_as_a_sentence() -> None:
    assert choices(["a"]) == "a" and choices(["a", "b"]) == "a or b" and choices(["a", "b", "c"]) == "a, b or c"
