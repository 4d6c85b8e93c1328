"""Running one request through an SP group step by step, and the one-device reference it must equal."""

from __future__ import annotations

import torch

from spotlight.diffusion.noise import initial_latents
from spotlight.models.generation import generate
from spotlight.models.policy import Policy
from spotlight.runtime.queue.request_queue import Request
from spotlight.runtime.sp.agent import NodeAgent


def denoise_on_group(
    agent: NodeAgent, group_name: str, request: Request, latent_shape: tuple[int, ...]
) -> torch.Tensor:
    """Every denoising step of ``request`` on the agent's group ``group_name``, from the seed's initial latent."""
    latent = initial_latents([request.seed], latent_shape)[0]
    for step in range(request.plan.num_steps):
        latent = agent.run_step(group_name, request, latent, step)
    return latent


def single_device(policy: Policy, request: Request) -> torch.Tensor:
    """The same request sampled by ``policy`` in this process."""
    with torch.no_grad():
        return generate(policy, [request.prompt], [request.seed], request.plan).final[0]
