"""One denoising step of a TinyDiT run sequence-parallel over an SP group: a plain function of tensors.

Parallelism is applied here, from outside the model: every rank embeds the whole (small) input,
keeps its contiguous token shard, runs the transformer blocks with `UlyssesAttention` over the group,
gathers the sequence back and unpatchifies. Every rank then holds the same velocity, so every rank
takes the same sampler step; the caller reads rank 0's latent.

`model_on_weights` builds the model *around* given tensors instead of initialising its own: a
persistent worker maps the agent's shared-memory weights (no copy) and a 100 M-parameter model
costs no random initialisation (which alone takes seconds on a CPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from spotlight.diffusion.sampler import SamplingPlan, VelocityFn, sample
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig, sincos_2d
from spotlight.models.ulysses import UlyssesAttention, check_sp_degree, gather_sequence, shard_sequence

__all__ = ["model_on_weights", "sequence_parallel_step", "sequence_parallel_velocity_fn"]


def model_on_weights(config: TinyDiTConfig, weights: Mapping[str, torch.Tensor], copy: bool = False) -> TinyDiT:
    """A TinyDiT in eval mode whose parameters *are* ``weights`` (``copy=False``) or copies of them.

    Built on the meta device and then assigned, so no memory is allocated or initialised for
    parameters that are about to be replaced. ``copy=True`` gives the process private tensors (what a
    GPU worker does anyway when it moves pinned host weights to its device).
    """
    with torch.device("meta"):
        model = TinyDiT(config)
    state = {name: tensor.clone() if copy else tensor for name, tensor in weights.items()}
    model.load_state_dict(state, assign=True, strict=True)
    # The one non-persistent buffer is a function of the config, not of the weights.
    model.image_pos = sincos_2d(config.image_size // config.patch_size, config.dim)[None]
    leftover = [name for name, tensor in model.state_dict(keep_vars=True).items() if tensor.is_meta]
    if leftover:
        raise RuntimeError(f"model_on_weights left {leftover} uninitialised: rebuild them from the config here")
    return model.eval()


def sequence_parallel_velocity_fn(model: TinyDiT, tokens: torch.Tensor, group: ProcessGroup | None) -> VelocityFn:
    """``v(x, sigma)`` computed by the SP ``group`` (None: one device); every rank returns the full velocity.

    The joint sequence (prompt tokens + image tokens) is sharded contiguously, so its length must be
    divisible by the group's size; `check_sp_degree` says which degrees fit otherwise.
    """
    rank = 0 if group is None else dist.get_rank(group)
    world = 1 if group is None else dist.get_world_size(group)
    check_sp_degree(world, num_heads=model.config.num_heads,
                    num_tokens=model.config.num_image_tokens + tokens.shape[1])
    model.attention_fn = UlyssesAttention(group)  # the worker's model serves one group at a time

    def velocity(x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        sequence, cond, mask = model.embed(x, sigma, tokens)
        local = shard_sequence(sequence, rank, world)
        local = model.run_blocks(local, cond, mask)
        full = gather_sequence(local, group)
        return model.unpatchify(full[:, tokens.shape[1]:], cond)

    return velocity


def sequence_parallel_step(
    model: TinyDiT,
    group: ProcessGroup | None,
    tokens: torch.Tensor,
    seeds: Sequence[int],
    plan: SamplingPlan,
    latents: torch.Tensor,
    step: int,
) -> torch.Tensor:
    """Latents (B, C, H, W) at schedule index ``step + 1`` from ``latents`` at ``step``.

    Step k's noise comes from stream (seed, k) (see `spotlight.diffusion.sampler.sample`), so the
    result does not depend on which group, or which formation of it, takes the step.
    """
    trajectory = sample(
        sequence_parallel_velocity_fn(model, tokens, group), seeds, plan, model.config.latent_shape,
        start_latents=latents, start_step=step, stop_step=step + 1, record=False,
    )
    return trajectory.final
