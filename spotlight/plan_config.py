"""What `spotlight plan` and `spotlight simulate` load: a simulation plus the training fields of the run to price.

A `SimConfig` with the training config's own ``model``, ``rollout``, ``train`` and ``dtype`` sections (the
classes `spotlight train` validates, so ``-s model.pretrained=DIR -s rollout.resolution=1280 -s
train.algorithm=nft`` mean what they mean there) and the simulator's ``plan`` section (the GPU). It lives
above both packages: the simulator reads it through `spotlight.sim.planning.folder_sim.PlanInputs` and imports no
training config.
"""

from __future__ import annotations

from typing import Literal

from spotlight.config import RolloutSection, TrainSection
from spotlight.models.policy_section import PolicySection
from spotlight.sim.planning.folder_sim import PlanSection
from spotlight.sim.sim_config import SimConfig

__all__ = ["PlanConfig"]


class PlanConfig(SimConfig):
    """A simulation and the training fields of the run it prices (module docstring)."""

    model: PolicySection = PolicySection()
    rollout: RolloutSection = RolloutSection()
    train: TrainSection = TrainSection()
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    plan: PlanSection = PlanSection()
