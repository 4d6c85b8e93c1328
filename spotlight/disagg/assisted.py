"""Trainer-assisted generation (TAG): the trainer draws a few fragments in a bubble, then resumes training.

In a bubble (the trainer has no complete group to train and waits for generators) the trainer's
devices generate eligible fragments themselves. The fragment is drawn with the trainer's current
weights, which mid-batch are still θ_v (the batch's one optimizer step has not been taken), so its
samples carry version v, pass the same version gate, scoring and group assembly as a generator's,
and differ from a generator's samples only in ``produced_by``. TAG takes no optimizer step: the
training state is offloaded around the fragment and restored byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from spotlight.diffusion.sampler import SamplingPlan
from spotlight.disagg.generators import ScoreFn, generate_fragment
from spotlight.disagg.offload import offload_training_state, restore_training_state
from spotlight.disagg.samples import ScoredSample
from spotlight.disagg.versions import VersionGate
from spotlight.models.policy import Policy


def trainer_assisted_fragment(
    model: Policy, optimizer: torch.optim.Optimizer, trainer_version: int, update_step: int, gate: VersionGate,
    members: Sequence[tuple[int, int]], tokens: torch.Tensor, seeds: torch.Tensor, plan: SamplingPlan,
    score: ScoreFn,
) -> list[ScoredSample]:
    """Generate and score ``members`` of batch ``update_step`` on the trainer holding θ_trainer_version.

    Refuses (ValueError) a fragment the version gate would not let a generator start with these
    weights: TAG must not widen the staleness bound.
    """
    if not gate.may_start(update_step, trainer_version):
        raise ValueError(f"TAG with θ_{trainer_version} may not generate for batch {update_step} "
                         f"(async_one_step={gate.async_one_step}): only fragments the version gate allows are eligible")
    state = offload_training_state(model, optimizer)
    try:
        model.eval()
        return generate_fragment(model, trainer_version, members, tokens, seeds, plan, score, "trainer")
    finally:
        restore_training_state(model, optimizer, state)
