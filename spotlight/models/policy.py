"""The policy interface: what the sampler, the losses, checkpoints and the runtime ask of a velocity model.

Spotlight trains two kinds of model, a TinyDiT trained in full and a diffusers transformer (SD3,
FLUX, Qwen-Image) trained through LoRA. Everything above ``spotlight.models`` is written against
this protocol, so the loop never asks which one it holds:

- the call ``policy(x, sigma, tokens) -> velocity``: latents (B, C, H, W), noise levels (B,) and
  prompt token ids (B, L) in, the velocity (B, C, H, W) out (``x_sigma = (1 - sigma) x0 + sigma noise``,
  ``v = noise - x0``), the one call the sampler and the GRPO / NFT losses make;
- ``trainable_parameters()``, what an optimizer steps (every weight of a TinyDiT, only LoRA's);
- ``broadcast_state()`` / ``load_broadcast_state()``, the tensors that change under training: what
  goes to spot devices every iteration and into checkpoints. For a LoRA policy these are the LoRA
  matrices alone; the base is rebuilt from ``describe()``;
- ``describe()``, JSON that rebuilds the policy without its trained tensors (``model.json``);
- ``attention_fn``, the attention kernel every block calls, the hook through which sequence
  parallelism is applied from outside (``spotlight.models.ulysses``);
- ``latent_shape`` and ``config.task`` / ``config.max_text_len``: what to sample and how its prompts
  are tokenized;
- ``tokenize(prompts, guided)``: the conditioning rows the call takes (a task's token ids, or a pipeline
  folder's prompt ids); ``decode_images(latents)``: what a reward sees (pixels as they are, or a VAE
  decode); ``schedule()``: a pipeline scheduler's sigma schedule, None for Spotlight's own;
- ``save_for_diffusers(directory)``: the file other tools load (None for a TinyDiT, which has none);
- ``shard_root``: the module whose ``nn.ModuleList`` children are the blocks FSDP shards one by one.

Every kind implements every member (`spotlight.models.spec` lists the kinds), so no caller outside
``spotlight.models`` asks which kind it holds.

Being ``runtime_checkable``, ``isinstance(model, Policy)`` checks that these members exist (not
their signatures); the conformance tests exercise each of them on both implementations.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn as nn

from spotlight.models.attention import AttentionFn


@runtime_checkable
class Policy(Protocol):
    """A velocity model Spotlight can sample from, train, checkpoint and broadcast (module docstring)."""

    config: Any  # its architecture record: ``task`` and ``max_text_len`` name the prompt tokenizer

    @property
    def attention_fn(self) -> AttentionFn | None:
        """The attention kernel of every block (None on a diffusers policy: its own processors)."""
        ...

    @attention_fn.setter
    def attention_fn(self, attention_fn: AttentionFn) -> None: ...

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the latents it denoises."""
        ...

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The velocity (B, C, H, W) at latents ``x`` (B, C, H, W), noise levels ``sigma`` (B,), prompts (B, L)."""
        ...

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimizer steps."""
        ...

    def broadcast_state(self) -> dict[str, torch.Tensor]:
        """Detached tensors that, loaded into a policy rebuilt from ``describe()``, reproduce this one."""
        ...

    def load_broadcast_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take the tensors of another policy's ``broadcast_state`` (same description); refuses a mismatch."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON: ``architecture``, ``config`` (and for a LoRA policy ``base``): what rebuilds it without its state."""
        ...

    def tokenize(self, prompts: Sequence[str], guided: bool = True) -> torch.Tensor:
        """The conditioning rows (B, L) int64 of ``prompts`` (``guided`` False: the CFG-free velocity's)."""
        ...

    def decode_images(self, latents: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1] of sampled latents: what a reward scores."""
        ...

    def prompt_conditioning(self, prompts: Sequence[str]) -> Any | None:
        """What another process holding this policy needs to condition on ``prompts`` without encoding them (a
        pipeline's cached text embeddings); None when the `tokenize` rows carry everything (a TinyDiT's ids)."""
        ...

    def adopt_prompt_conditioning(self, conditioning: Any | None) -> None:
        """Take another process's `prompt_conditioning` into this one's cache (None: nothing to take)."""
        ...

    def schedule(self) -> Any | None:
        """Its own sampling schedule (a pipeline's ``ScheduleParams``), or None for Spotlight's sigma schedule."""
        ...

    def save_for_diffusers(self, directory: str | Path) -> Path | None:
        """Write the files diffusers loads this policy from into ``directory``; None when it has no such format."""
        ...

    @property
    def shard_root(self) -> nn.Module:
        """The module whose ``nn.ModuleList`` children are its blocks (what FSDP shards block by block)."""
        ...

    # the nn.Module surface the loop uses
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def train(self, mode: bool = True) -> Any: ...

    def eval(self) -> Any: ...

    def requires_grad_(self, requires_grad: bool = True) -> Any: ...


def to_images(latents: torch.Tensor) -> torch.Tensor:
    """Model space [-1, 1] to images in [0, 1], (B, 3, H, W): the decode of a pixel-space policy."""
    return ((latents + 1.0) / 2.0).clamp(0.0, 1.0)
