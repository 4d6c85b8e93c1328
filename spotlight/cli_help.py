"""The ``spotlight`` command's help texts, written from the code's own lists so they cannot go stale.

A help text that spells out the modes, the update algorithms, the reward names or the model families by
hand went stale the day one was added (``train --help`` once named Flow-GRPO, the old default, and missed
the disaggregated mode). Each list here is read from where the code defines it: the `Mode` enum, the
config's ``Literal`` types (and their defaults), `BUILTIN_REWARDS`, the task and family names.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, get_args

from spotlight.config import TrainConfig, TrainSection
from spotlight.models.pipelines.family_config import Family
from spotlight.modes import Mode
from spotlight.rewards.section import BUILTIN_REWARDS
from spotlight.runtime.section import RuntimeSection
from spotlight.tasks import TaskName

__all__ = ["APP_HELP", "FAMILY_HELP", "MODES_HELP", "TASK_HELP", "TRAIN_DEFAULT_RUN", "TRAIN_HELP", "choices",
           "literal_values"]

_ALGORITHM_NAMES = {"nft": "NFT", "flow-grpo": "Flow-GRPO"}  # how the papers write them; others as in the config


def choices(values: Iterable[str]) -> str:
    """``"a, b or c"``: a list as a sentence reads it."""
    names = list(values)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def literal_values(section: type[Any], field: str) -> tuple[str, ...]:
    """The values a ``Literal[...]`` config field allows, in the order the config declares them."""
    return get_args(section.model_fields[field].annotation)


def _algorithms() -> str:
    """The update algorithms, the config's default first and marked as such."""
    default = TrainSection.model_fields["algorithm"].default
    ordered = [default, *(name for name in literal_values(TrainSection, "algorithm") if name != default)]
    named = [_ALGORITHM_NAMES.get(name, name) for name in ordered]
    return f"{named[0]} (default) or {', '.join(named[1:])}" if len(named) > 1 else named[0]


APP_HELP = ("Spotlight: RL post-training of diffusion transformers "
            f"({choices(_ALGORITHM_NAMES.get(name, name) for name in literal_values(TrainSection, 'algorithm'))}) "
            "on spot devices.")
MODES_HELP = choices(Mode)
TRAIN_HELP = (
    f"Post-train the base model with {_algorithms()} (train.algorithm). Modes (mode): {MODES_HELP}; "
    f"default {TrainConfig.model_fields['mode'].default}. Rewards (reward.name): the task's own, "
    f"{', '.join(BUILTIN_REWARDS)}, http or pkg.module:function."
)
_RUNTIME = RuntimeSection()
TRAIN_DEFAULT_RUN = (
    f"With no arguments: mode {TrainConfig.model_fields['mode'].default} on a local Ray cluster (one on-demand "
    f"device, {_RUNTIME.num_spot_devices} spot device(s), the spot trace {_RUNTIME.trace} replayed "
    f"{1 / _RUNTIME.time_scale:g}x faster), stopping after runtime.max_wall_s ({_RUNTIME.max_wall_s:g} s), then an "
    "HTML report. Details (Ray's own output, warnings, an unexpected error's traceback) go to RUN_DIR/spotlight.log."
)
TASK_HELP = choices(get_args(TaskName))
# make-tiny-pipeline also builds the edit pipelines and Wan2.2's two experts (wan22)
FAMILY_HELP = choices([*get_args(Family), "flux-kontext", "qwen-image-edit", "qwen-image-edit-plus", "wan22"])
