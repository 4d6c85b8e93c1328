"""A Wan2.2 A14B pipeline folder as a policy: both experts trained (LoRA on each), the pipeline's switch between them.

``TwoExpertsPolicy`` is a `PipelinePolicy` whose ``transformer`` is `TwoExperts`: the folder's ``transformer``
(high noise) and ``transformer_2`` (low noise), each loaded as diffusers loads it and each given the run's
LoRA adapter. Every forward routes its rows by sigma (`high_noise_rows`), so sampling, exploration, NFT and
Flow-GRPO run unchanged; prompts, guidance, the VAE and checkpoints are the pipeline policy's own.

Guidance: ``WanPipeline`` guides the high-noise expert's steps at ``guidance_scale`` and the low-noise one's at
``guidance_scale_2`` (``guidance_scale`` when not given), so do Spotlight's ``rollout.guidance_scale`` and
``rollout.guidance_scale_2``: :meth:`TwoExpertsPolicy.guidance_scale_at` picks each guided row's scale on the device
by the rule that picks its expert (`high_noise_rows`), with nothing read back to the host.

What diffusers loads (`save_for_diffusers`): ``WanLoraLoaderMixin.load_lora_weights`` loads one file into one
transformer (``load_into_transformer_2=True`` sends a file's ``transformer.`` keys to ``transformer_2``), so the
experts' LoRA are two files in diffusers' own format::

    pipe.load_lora_weights(folder)                                           # transformer
    pipe.load_lora_weights(folder, weight_name="pytorch_lora_weights_2.safetensors",
                           load_into_transformer_2=True)                     # transformer_2

A fully fine-tuned policy writes ``transformer/`` and ``transformer_2/`` folders instead.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spotlight.models.pipelines.adapter import ADAPTER_NAME
from spotlight.models.pipelines.export import save_diffusers_lora, save_transformer_folder
from spotlight.models.pipelines.folder import PipelineFolder, PipelineFolderError
from spotlight.models.pipelines.loading import load_transformer
from spotlight.models.pipelines.policy import PipelinePolicy
from spotlight.models.video.experts import TwoExperts, high_noise_rows

__all__ = ["LOW_NOISE_LORA_FILE", "TwoExpertsPolicy"]

LOW_NOISE_LORA_FILE = "pytorch_lora_weights_2.safetensors"  # transformer_2's, loaded with load_into_transformer_2


class TwoExpertsPolicy(PipelinePolicy):
    """A two-expert Wan2.2 folder's policy (module docstring)."""

    @classmethod
    def load_transformer(cls, folder: PipelineFolder, dtype: torch.dtype) -> torch.nn.Module:
        """Both experts, ``transformer/`` and ``transformer_2/``, behind `TwoExperts` with the folder's boundary."""
        if folder.boundary_ratio is None:
            raise PipelineFolderError(f"{folder.path} has one transformer: load it as a pipeline folder (Wan2.1), "
                                      f"not as Wan2.2's two experts")
        high = load_transformer(folder.family, str(folder.path), dtype)
        low = load_transformer(folder.family, str(folder.path / "transformer_2"), dtype)
        return TwoExperts(high, low, folder.boundary_ratio)

    @property
    def experts(self) -> TwoExperts:
        assert isinstance(self.transformer, TwoExperts)
        return self.transformer

    def guidance_scale_at(self, sigma: torch.Tensor) -> float | torch.Tensor:
        """``guidance_scale`` for rows at the high-noise expert's noise levels ``sigma`` (B,), ``guidance_scale_2``
        for the low-noise expert's (a (B,) tensor on sigma's device); one number when both are the same."""
        high, low = self.config.guidance_scale, self.config.guidance_scale_2
        if low is None or low == high:
            return high
        return torch.where(high_noise_rows(sigma, self.experts.boundary_ratio), high, low)

    def save_for_diffusers(self, directory: str | Path) -> Path:
        """Write what ``WanPipeline`` loads both experts from into ``directory`` (module docstring); returns the
        high-noise expert's file (or folder)."""
        high, low = self.experts.experts
        if self.config.finetune == "full":
            save_transformer_folder(low, directory, name="transformer_2")
            return save_transformer_folder(high, directory)
        save_diffusers_lora(low, self.family, ADAPTER_NAME, directory, weight_name=LOW_NOISE_LORA_FILE)
        return save_diffusers_lora(high, self.family, ADAPTER_NAME, directory)
