"""What `spotlight serve-reward` serves: the reward a training config names, or a toy task's, on a given device.

A config's reward (built-in, composite or `pkg.module:function`) is served at any image size within
the server's limits, since real pipelines make 512-1328 px images; a toy task's reward keeps its
task's one size, which is the only size it can judge. Serving `reward.name: http` is refused: a
server that forwards to another server adds a hop and a failure point for nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotlight.config import TrainConfig
from spotlight.rewards.base import Reward, RewardError
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection
from spotlight.task_presets import get_task


@dataclass(frozen=True)
class ServedReward:
    """The reward to serve, and the one image size it judges (None: any size within the server's limits)."""

    reward: Reward
    image_size: tuple[int, int] | None
    description: str


def served_reward(config: TrainConfig | None, task: str, device: str | None) -> ServedReward:
    """The config's reward (on `device` when given), or, without a config, the toy task `task`'s reward."""
    if config is None:
        served = get_task(task)
        return ServedReward(served.make_reward(0.0), served.image_size, f"the {task} task's reward")
    section: RewardSection = config.reward
    if device is not None:
        section = section.model_copy(update={"device": device})
    if section.name == "http" or "http" in (section.weights or {}):
        raise RewardError("the config's reward is http: serve the reward that server serves instead (set "
                          "reward.name to it), or point the trainer at that server directly")
    reward = build_reward(section, get_task(config.task).make_reward)
    image_size = get_task(config.task).image_size if section.name is None and section.weights is None else None
    return ServedReward(reward, image_size, f"reward {reward.name!r} on {section.device}")
