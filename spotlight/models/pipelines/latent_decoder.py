"""A pipeline's VAE as the last step before the reward: latents (B, C, h, w) -> images (B, 3, H, W) in [0, 1].

The latents a policy samples are in the transformer's normalised space; each family undoes its own
normalisation before ``vae.decode``, exactly as its pipeline does: SD3 and FLUX divide by the VAE's
``scaling_factor`` and add its ``shift_factor``; Qwen-Image multiplies by ``latents_std`` and adds
``latents_mean`` per channel, and its VAE is a video VAE (one frame); Wan's is the same normalisation
over (B, C, f, h, w) video latents, decoded into (B, F, 3, H, W) videos. A Wan VAE decodes one latent
frame at a time through its causal cache, so a chunk of one video costs one frame's activations. The
decoded [-1, 1] image is mapped to [0, 1] as ``VaeImageProcessor.postprocess`` does, which is what rewards take.
"""

from __future__ import annotations

from typing import Any

import torch

from spotlight.models.pipelines.folder import PipelineFolder, component_class
from spotlight.models.pipelines.loading import quiet_loading

__all__ = ["LatentDecoder"]


class LatentDecoder:
    """The folder's VAE (frozen, loaded on first use) and its family's latent normalisation.

    Shared between the loop's copies of a policy (see ``__deepcopy__``): it holds no trained weight.
    """

    def __init__(self, folder: PipelineFolder, dtype: torch.dtype, device: torch.device | str = "cpu",
                 batch_size: int = 8) -> None:
        self.folder = folder
        self.dtype = dtype
        self.device = torch.device(device)
        self.batch_size = batch_size
        self._vae: Any = None

    def __deepcopy__(self, memo: dict[int, Any]) -> LatentDecoder:
        return self

    @property
    def vae(self) -> Any:
        if self._vae is None:
            cls = component_class(self.folder, "vae")  # the class model_index.json names, as diffusers loads it
            with quiet_loading():
                self._vae = cls.from_pretrained(str(self.folder.path / "vae"), dtype=self.dtype)
            self._vae.requires_grad_(False).eval().to(self.device)
        return self._vae

    def to(self, device: torch.device | str) -> LatentDecoder:
        """Run the VAE on ``device`` from now on."""
        self.device = torch.device(device)
        if self._vae is not None:
            self._vae.to(self.device)
        return self

    def vae_input(self, latents: torch.Tensor) -> torch.Tensor:
        """What the family's pipeline hands ``vae.decode``: the latents with the family's normalisation undone."""
        config = self.vae.config
        if self.folder.family in ("qwen-image", "wan"):
            shape = (1, config.z_dim) + (1,) * (latents.dim() - 2)
            mean = torch.tensor(config.latents_mean, dtype=latents.dtype, device=latents.device).view(shape)
            std = torch.tensor(config.latents_std, dtype=latents.dtype, device=latents.device).view(shape)
            return latents * std + mean
        return latents / config.scaling_factor + (config.shift_factor or 0.0)

    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W), float32 in [0, 1], on the CPU, decoded ``batch_size`` at a time without gradients;
        a video family's (B, F, 3, H, W), one video at a time (its VAE streams the frames).

        The latents go to the VAE's device in one copy and the images come back in one: the chunks are
        decoded and gathered on the device, so no chunk waits for a host copy of the one before.
        """
        on_device = latents.to(self.device, torch.float32)
        images = []
        chunk = 1 if self.folder.is_video else self.batch_size
        with torch.no_grad():
            for start in range(0, latents.shape[0], chunk):
                z = self.vae_input(on_device[start:start + chunk]).to(self.dtype)
                if self.folder.is_video:  # (b, 3, F, H, W) -> (b, F, 3, H, W), as WanPipeline's "pt" output
                    decoded = self.vae.decode(z, return_dict=False)[0].transpose(1, 2)
                elif self.folder.family == "qwen-image":
                    decoded = self.vae.decode(z[:, :, None], return_dict=False)[0][:, :, 0]
                else:
                    decoded = self.vae.decode(z, return_dict=False)[0]
                images.append((decoded.float() * 0.5 + 0.5).clamp(0.0, 1.0))
        return torch.cat(images).cpu()
