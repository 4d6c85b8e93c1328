"""The policy a training run starts from: what ``model`` and ``base_checkpoint`` of the config name.

One call for the loop, whatever the model: a TinyDiT loaded from its base checkpoint (every weight
trained), or a diffusers transformer with LoRA rebuilt from the ``model`` section (base drawn from
``init_seed``, LoRA B at zero, so the policy starts as its base). Called twice it returns two equal
policies, which is how the loop gets its frozen reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spotlight.models.policy import Policy
from spotlight.models.rebuild import policy_from_config
from spotlight.rl.checkpoint import load_model
from spotlight.tasks.registry import get_task

if TYPE_CHECKING:
    from spotlight.config import TrainConfig

__all__ = ["build_policy"]


def build_policy(config: TrainConfig) -> Policy:
    """The run's initial policy (see the module docstring); a config error names the field."""
    section = config.model
    if section.family == "tinydit":
        return load_model(config.base_checkpoint)
    task = get_task(config.task)
    return policy_from_config(section.diffusers_config(task.name, task.vocab_size, task.image_size))
