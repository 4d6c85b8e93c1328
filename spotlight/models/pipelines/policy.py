"""A whole diffusers pipeline folder as a policy: its transformer trained, its text encoders and VAE frozen around it.

``PipelinePolicy`` is a `DiffusersPolicy` (LoRA or full fine-tuning, checkpoints, broadcasts, attention
routing are the same code) whose conditioning and output are the pipeline's own:

- **prompts**: ``tokenize(prompts)`` gives (B, 2) int64 rows ``[prompt id, guided]``. The id indexes this
  process's `PromptCache` of ``pipe.encode_prompt`` embeddings (see `spotlight.models.pipelines.prompts`
  for why ids, not embeddings, travel through the loop); ``guided`` says whether the caller wants the
  classifier-free-guided velocity (1) or the conditional one (0). Carrying that choice in the
  conditioning lets one policy serve both: sampling, exploration and Flow-GRPO's log-prob of the guided
  step ask for guided rows, and the NFT update asks for conditional rows, since DiffusionNFT trains
  CFG-free (its implicit policies are the conditional velocity; guidance is a sampling-time choice).
- **guidance**: with ``guidance_scale`` > 1, guided rows get one batched forward of the conditional
  and the negative-prompt (``negative_prompt``, default "") halves, combined as the family's pipeline
  combines them (`spotlight.models.pipelines.guidance`); a guidance-distilled FLUX gets the scale as its
  ``guidance`` input instead. The scale of a guided row is :meth:`guidance_scale_at` its noise level: one
  number here, a two-expert Wan2.2 policy's per expert (``guidance_scale_2``), so every caller (sampling,
  exploration, Flow-GRPO's log-probs, an SP step) guides a step at the scale the pipeline would.
- **latents**: (C, h, w) from the VAE scale factor and the transformer's channels at ``resolution``
  (FLUX / Qwen-Image pack 2x2 inside the forward); ``decode_images`` runs the VAE (`LatentDecoder`).
- **device**: the forward takes latents on any device, runs on the transformer's, and answers on the
  caller's, so the loop's CPU tensors (seeded noise, commits, checkpoints) stay as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spotlight.diffusion.sampler import to_device
from spotlight.models.pipelines.adapter import DiffusersPolicy
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig
from spotlight.models.pipelines.folder import PipelineFolder, ScheduleParams, read_pipeline_folder
from spotlight.models.pipelines.guidance import guided_velocity, uses_true_cfg
from spotlight.models.pipelines.inputs import PromptEmbeddings, moved_to, transformer_velocity
from spotlight.models.pipelines.latent_decoder import LatentDecoder
from spotlight.models.pipelines.loading import load_transformer
from spotlight.models.pipelines.prompts import PromptBatch, PromptCache

__all__ = ["PipelinePolicy"]


class PipelinePolicy(DiffusersPolicy):
    """A pipeline folder's transformer (trained) with its text encoders and VAE (frozen, shared by copies)."""

    def __init__(self, transformer: torch.nn.Module, config: DiffusersPolicyConfig, folder: PipelineFolder,
                 prompts: PromptCache, decoder: LatentDecoder) -> None:
        super().__init__(transformer, config)
        self.folder = folder
        self.prompts = prompts
        self.decoder = decoder
        self._latent_size = folder.latent_size(config.resolution or folder.default_resolution)
        self.true_cfg = uses_true_cfg(config.family, config.guidance_scale,
                                      bool(getattr(transformer.config, "guidance_embeds", False)))
        if self.true_cfg and folder.edits:
            raise ValueError(f"{folder.path} is an edit pipeline without a guidance embedding: true CFG against a "
                             "negative prompt is not implemented for edits; set rollout.guidance_scale 1")

    @classmethod
    def from_config(cls, config: DiffusersPolicyConfig) -> PipelinePolicy:
        """Load the folder's transformer (``config.dtype``; float32 for full fine-tuning) and wrap it.

        The text encoders and the VAE load on first use (a prompt to encode, latents to decode), so a
        process that only denoises committed latents of known prompts never pays for them.
        """
        if not config.pipeline or config.pretrained is None:
            raise ValueError("PipelinePolicy needs pipeline: true and pretrained set to a pipeline folder")
        folder = read_pipeline_folder(config.pretrained)
        if folder.family != config.family:
            raise ValueError(f"{folder.path} holds a {folder.family} pipeline, not {config.family}: set family to "
                             f"{folder.family}")
        folder.latent_shape(config.resolution or folder.default_resolution, config.num_frames)  # fails before loading
        folder.check_guidance_scale_2(config.guidance_scale, config.guidance_scale_2)
        dtype = torch.float32 if config.finetune == "full" else config.torch_dtype
        transformer = cls.load_transformer(folder, dtype)
        prompts = PromptCache(folder, config.torch_dtype, config.max_sequence_length)
        decoder = LatentDecoder(folder, config.torch_dtype)
        if folder.edits:  # each row's source image encoded once, beside its instruction (spotlight.models.editing)
            from spotlight.models.editing.condition import ConditionImages

            prompts.condition = ConditionImages(decoder, config.resolution or folder.default_resolution,
                                                folder.vae_scale_factor)
            prompts.encode_batch = prompts.condition.encode_batch  # Qwen-Image-Edit-2509: a row per call
        return cls(transformer, config, folder, prompts, decoder)

    @classmethod
    def load_transformer(cls, folder: PipelineFolder, dtype: torch.dtype) -> torch.nn.Module:
        """The folder's trained module: its ``transformer/`` (a two-expert folder's policy loads both experts)."""
        if folder.boundary_ratio is not None:
            raise ValueError(f"{folder.path} holds two experts (transformer_2): build its policy with "
                             "spotlight.models.rebuild.policy_from_config, which loads both")
        return load_transformer(folder.family, str(folder.path), dtype)

    # --- what the loop asks of it ----------------------------------------------------------------

    @property
    def latent_shape(self) -> tuple[int, ...]:
        """(C, h, w) of the unpacked latents at the configured resolution; a video's (C, f, h, w)."""
        return self.folder.latent_shape(self.config.resolution or self.folder.default_resolution,
                                        self.config.num_frames)

    @property
    def device(self) -> torch.device:
        """Where the transformer runs."""
        return next(self.transformer.parameters()).device

    def schedule(self) -> ScheduleParams:
        """The pipeline scheduler's sigma schedule at this policy's latent size."""
        return self.folder.schedule(self._latent_size)

    def tokenize(self, prompts: Sequence[str], guided: bool = True) -> torch.Tensor:
        """Rows ``[prompt id, guided]`` (B, 2) int64, encoding each new prompt once (module docstring)."""
        ids = self.prompts.ids(prompts)
        return torch.stack([ids, torch.full_like(ids, int(guided))], dim=1)

    def prompt_conditioning(self, prompts: Sequence[str]) -> dict[int, tuple[str, Any]]:
        """The cached embeddings of ``prompts`` (encoding those not yet seen), for `adopt_prompt_conditioning`."""
        return self.prompts.export(prompts)

    def adopt_prompt_conditioning(self, conditioning: dict[int, tuple[str, Any]] | None) -> None:
        """Another process's embeddings of its prompts into this one's cache: they need no encoding here."""
        if conditioning:
            self.prompts.adopt(conditioning)

    def place_text_encoders(self, placement: str, prompts: Sequence[str] = ()) -> None:
        """Where the text encoders live for the run (`spotlight.loop.text_encoders`): ``resident``
        (on the transformer's device from now on; prompts are encoded as they come, each call's in batches) or
        ``precompute`` (``prompts``, every prompt the run will see, encoded now in batches; the encoders then
        leave the device for good). The negative prompt of true CFG is one of them. Call it once, before the
        loop."""
        prompts = [*prompts, *([self.config.negative_prompt] if self.true_cfg else [])]
        if placement == "resident":  # each iteration's new prompts are encoded there, in one batch
            self.prompts.keep_resident()
        elif placement == "precompute":
            self.prompts.precompute(prompts)
        else:
            raise ValueError(f"text encoder placement must be resident or precompute (got {placement!r})")

    def decode_images(self, latents: torch.Tensor) -> torch.Tensor:
        """Images (B, 3, H, W) in [0, 1] on the CPU: the VAE decode of sampled latents (B, C, h, w); a video
        family's videos (B, F, 3, H, W) of latents (B, C, f, h, w)."""
        return self.decoder(latents)

    def to(self, *args, **kwargs) -> PipelinePolicy:  # type: ignore[override]
        """Move the transformer as ``nn.Module.to`` does; the VAE and the text encoders follow to its device."""
        result = super().to(*args, **kwargs)
        self.decoder.to(self.device)
        self.prompts.device = self.device
        return result

    def guidance_scale_at(self, sigma: torch.Tensor) -> float | torch.Tensor:
        """The classifier-free guidance scale of guided rows at noise levels ``sigma`` (B,): ``guidance_scale``
        at every step (`TwoExpertsPolicy` answers a scale per row, its experts' own)."""
        return self.config.guidance_scale

    def bind_prompts(self, tokens: torch.Tensor) -> PromptBatch:
        """The conditioning of id rows ``[prompt id, guided]`` (B, 2), resolved once onto the transformer's device.

        Reads the ids on the host (one sync when they sit on the device), so call it once per rollout chunk
        or update minibatch, outside the loops; slices of the result (micro-batches) and forwards on it read
        nothing back from the device (`spotlight.models.pipelines.prompts`).
        """
        if tokens.dim() != 2 or tokens.shape[1] != 2:
            raise ValueError(f"a pipeline policy is conditioned on (B, 2) rows [prompt id, guided] (got shape "
                             f"{tuple(tokens.shape)}): make them with policy.tokenize(prompts)")
        rows = tokens.cpu().tolist()
        guided = [bool(flag) for _, flag in rows]
        negative = self.config.negative_prompt if self.true_cfg and any(guided) else None
        return self.prompts.bind([key for key, _ in rows], guided, negative, self.device)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor,
                cond: torch.Tensor | PromptBatch | PromptEmbeddings) -> torch.Tensor:
        """Velocity (B, C, h, w) at latents ``x`` and noise levels ``sigma`` (B,), guided where ``cond`` asks.

        ``cond``: a `PromptBatch` from :meth:`bind_prompts` (no host sync), rows ``[prompt id, guided]``
        from :meth:`tokenize` (bound here, at every call), or ``PromptEmbeddings`` (the conditional
        velocity of those embeddings). One transformer call: the guided rows' negative-prompt half rides
        in the same batch.
        """
        if isinstance(cond, PromptEmbeddings):
            return super().forward(x, sigma, cond)
        if not isinstance(cond, PromptBatch):
            cond = self.bind_prompts(cond)
        batch, device = x.shape[0], self.device
        if len(cond) != batch:
            raise ValueError(f"got {len(cond)} prompt rows for {batch} latents: pass one row per latent")
        latents, sigmas = moved_to(x, device), moved_to(sigma, device).expand(batch)  # the loop's: there already
        guided_rows = cond.guided_rows()
        rows = None
        if guided_rows and len(guided_rows) < batch:  # a mixed batch: index the guided rows (host list, no sync)
            rows = to_device(torch.tensor(guided_rows, dtype=torch.int64), device)
        if guided_rows:
            latents = torch.cat([latents, latents if rows is None else latents[rows]])
            sigmas = torch.cat([sigmas, sigmas if rows is None else sigmas[rows]])
        embeddings = cond.forward_embeddings(len(guided_rows))
        with self.autocast(device):
            velocity = transformer_velocity(self.transformer, self.family, latents, sigmas, embeddings,
                                            self.config.guidance_scale)
        if guided_rows:
            conditional, unconditional = velocity[:batch], velocity[batch:]
            scale = self.guidance_scale_at(sigmas[batch:])  # the guided rows' noise levels, in their order
            if rows is None:
                velocity = guided_velocity(self.family, conditional, unconditional, scale)
            else:
                combined = guided_velocity(self.family, conditional[rows], unconditional, scale)
                velocity = conditional.index_copy(0, rows, combined)
        return moved_to(velocity, x.device)  # a caller's CPU latents get a CPU velocity
