"""Wan2.2 A14B's two experts behind one transformer interface: the high-noise one above the boundary, the other below.

``WanPipeline`` with ``transformer_2`` and ``boundary_ratio`` denoises timestep ``t`` with ``transformer`` when
``t >= boundary_ratio * num_train_timesteps`` and with ``transformer_2`` below. Its ``t`` is the scheduler's
float32 ``sigma * num_train_timesteps``, which is the ``1000 * sigma`` (float32) that
`spotlight.models.pipelines.inputs.transformer_velocity` hands a Wan transformer, so the choice is a pure
function of sigma and the ratio (`high_noise_rows`). ``TwoExperts`` is what a `DiffusersPolicy` holds as its
``transformer``: it answers the calls a single transformer answers (forward, LoRA, attention processors,
gradient checkpointing) and routes each row of a forward to its expert, so the samplers, NFT and Flow-GRPO
call it exactly as they call Wan2.1's transformer. A batch whose rows straddle the boundary (NFT draws a
sigma per row) runs each expert on its own rows.

The experts sit in one ``ModuleList``, so FSDP (`spotlight.ranks.data_parallel`, full fine-tuning on several
ranks) shards each expert as one unit, not block by block: the expert that runs is gathered whole. Their
parameter names start ``experts.0.`` (high noise) and ``experts.1.`` (low noise); that is the key format of
Spotlight's own LoRA files and broadcasts.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from spotlight.diffusion.sampler import to_device

__all__ = ["TRAIN_TIMESTEPS", "TwoExperts", "high_noise_rows", "high_noise_timesteps"]

TRAIN_TIMESTEPS = 1000  # the timestep scale Wan's transformer is handed (transformer_velocity's 1000 * sigma)


def high_noise_rows(sigma: torch.Tensor, boundary_ratio: float, num_train_timesteps: int = TRAIN_TIMESTEPS
                    ) -> torch.Tensor:
    """Which rows of noise levels ``sigma`` (B,) the high-noise expert denoises: WanPipeline's ``t >= boundary``
    with ``t = sigma * num_train_timesteps`` in float32, as its scheduler computes its timesteps."""
    return high_noise_timesteps(sigma.to(torch.float32) * num_train_timesteps, boundary_ratio, num_train_timesteps)


def high_noise_timesteps(timestep: torch.Tensor, boundary_ratio: float, num_train_timesteps: int = TRAIN_TIMESTEPS
                         ) -> torch.Tensor:
    """`high_noise_rows` of timesteps ``t`` (B,) as the transformer is handed them (no round trip through sigma)."""
    return timestep >= boundary_ratio * num_train_timesteps


class TwoExperts(nn.Module):
    """``transformer`` (high noise) and ``transformer_2`` (low noise) answering as one Wan transformer (module
    docstring). ``boundary_ratio``: the pipeline's; every other attribute read (``config``, ``dtype``) is the
    high-noise expert's, since both share one architecture (`spotlight.models.pipelines.folder` checks it)."""

    def __init__(self, transformer: nn.Module, transformer_2: nn.Module, boundary_ratio: float) -> None:
        super().__init__()
        self.experts = nn.ModuleList([transformer, transformer_2])
        self.boundary_ratio = float(boundary_ratio)

    @property
    def config(self) -> Any:
        return self.experts[0].config

    @property
    def dtype(self) -> torch.dtype:
        return self.experts[0].dtype

    def forward(self, hidden_states: torch.Tensor, timestep: torch.Tensor, encoder_hidden_states: torch.Tensor,
                return_dict: bool = False, **kwargs: Any) -> tuple[torch.Tensor]:
        """The Wan transformer's output (``return_dict=False``'s tuple) with each row from its expert.

        ``timestep`` is ``1000 * sigma`` (B,). Which expert takes which rows is read on the host: one (B,)
        read per forward (the sampler and the update build sigma on the device), the price of running one
        expert per row instead of both on every row.
        """
        if return_dict:
            raise ValueError("TwoExperts answers as transformer(..., return_dict=False) does: pass return_dict=False")
        high = high_noise_timesteps(timestep, self.boundary_ratio).tolist()
        if all(high) or not any(high):
            expert = self.experts[0 if high and high[0] else 1]
            return expert(hidden_states=hidden_states, timestep=timestep, encoder_hidden_states=encoder_hidden_states,
                          return_dict=False, **kwargs)
        out: torch.Tensor | None = None
        for index, wanted in enumerate((True, False)):
            rows = to_device(torch.tensor([i for i, flag in enumerate(high) if flag == wanted]), hidden_states.device)
            part = self.experts[index](hidden_states=hidden_states[rows], timestep=timestep[rows],
                                       encoder_hidden_states=encoder_hidden_states[rows], return_dict=False,
                                       **kwargs)[0]
            out = torch.zeros_like(hidden_states, dtype=part.dtype) if out is None else out
            out = out.index_copy(0, rows, part)
        assert out is not None
        return (out,)

    # --- what DiffusersPolicy asks of its transformer, asked of both experts -------------------------------

    def add_adapter(self, adapter_config: Any, adapter_name: str) -> None:
        for expert in self.experts:
            expert.add_adapter(adapter_config, adapter_name=adapter_name)

    @property
    def peft_config(self) -> dict[str, Any]:
        """The adapters' configs: one LoRA config serves both experts (peft's state-dict helpers read it)."""
        return self.experts[0].peft_config

    def disable_adapters(self) -> None:
        for expert in self.experts:
            expert.disable_adapters()

    def enable_adapters(self) -> None:
        for expert in self.experts:
            expert.enable_adapters()

    def enable_gradient_checkpointing(self) -> None:
        for expert in self.experts:
            expert.enable_gradient_checkpointing()

    @property
    def attn_processors(self) -> dict[str, Any]:
        """Every attention processor, keyed ``experts.<i>.<diffusers' own key>``."""
        return {f"experts.{i}.{name}": processor for i, expert in enumerate(self.experts)
                for name, processor in expert.attn_processors.items()}

    def set_attn_processor(self, processor: Any) -> None:
        """One processor for every attention layer, or a dict keyed as :attr:`attn_processors` is."""
        for i, expert in enumerate(self.experts):
            if isinstance(processor, dict):
                prefix = f"experts.{i}."
                expert.set_attn_processor({name[len(prefix):]: value for name, value in processor.items()
                                           if name.startswith(prefix)})
            else:
                expert.set_attn_processor(processor)
