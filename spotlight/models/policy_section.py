"""The ``model`` section of a training config: which policy ``spotlight train`` trains.

``tinydit`` (the default) trains every weight of the TinyDiT in ``base_checkpoint``. ``sd3``,
``flux`` and ``qwen-image`` train LoRA on a small randomly initialised diffusers transformer of that
family, built from this section and the task: it denoises the task's images directly (3 channels,
no VAE, so the task's reward scores its samples as it scores a TinyDiT's), its prompts are the
task's token ids through a frozen text encoder, and every random weight comes from ``init_seed``.
That seed, not a file, is the base a LoRA checkpoint refers to.

``pretrained: FOLDER`` trains a real diffusers pipeline folder instead (`spotlight.models.pipelines.policy`):
its family comes from the folder's ``model_index.json``, its prompts are encoded by its own text
encoders, it samples latents at ``rollout.resolution`` on its scheduler's schedule, with
``rollout.guidance_scale``, and its VAE decodes them for the reward. ``finetune`` picks LoRA (rank,
alpha, targets as for the tiny families) or every transformer weight.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from spotlight.models.pipelines.family_config import TINY_CONFIGS, DiffusersPolicyConfig, DTypeName, Finetune
from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder
from spotlight.schema import Section

PolicyFamily = Literal["tinydit", "sd3", "flux", "qwen-image", "wan"]
IMAGE_CHANNELS = 3  # the tasks' RGB images are the latents: no VAE between the transformer and the reward


def image_geometry(family: str, overrides: dict[str, Any], height: int, width: int) -> dict[str, Any]:
    """Transformer arguments that make a tiny ``family`` model denoise (3, height, width) images.

    FLUX and Qwen-Image take 2x2-packed tokens of 4 x 3 channels; SD3 patchifies inside, and its
    position table must cover the (height / patch) grid.
    """
    if height != width:
        raise ValueError(f"model.family {family} builds square images only (the task's are {height}x{width}): "
                         "use model.family tinydit for this task")
    if family == "sd3":
        patch = int(overrides.get("patch_size", TINY_CONFIGS["sd3"]["patch_size"]))
        return {"in_channels": IMAGE_CHANNELS, "out_channels": IMAGE_CHANNELS, "sample_size": height,
                "pos_embed_max_size": height // patch}
    packed = 4 * IMAGE_CHANNELS
    return {"in_channels": packed} if family == "flux" else {"in_channels": packed, "out_channels": IMAGE_CHANNELS}


class PolicySection(Section):
    """Which policy to train: the base checkpoint's TinyDiT, or LoRA on a tiny diffusers transformer."""

    family: PolicyFamily = "tinydit"
    init_seed: int = 0  # diffusers families: the random base (and text encoder) drawn from this seed
    lora_rank: int = Field(4, ge=1)
    lora_alpha: float = Field(8.0, gt=0)
    lora_target_modules: tuple[str, ...] | None = None  # None: every joint-attention projection
    max_text_len: int = Field(12, ge=1)  # prompt tokens (a multiple of an SP degree when sharded)
    transformer: dict[str, Any] = Field(default_factory=dict)  # overrides of the tiny architecture
    # a local diffusers pipeline folder (model_index.json, transformer/, vae/, text_encoder*/, tokenizer*/,
    # scheduler/); its family is read from model_index.json (model.family may name it, or stay tinydit)
    pretrained: str | None = None
    finetune: Finetune = "lora"  # lora: the adapters alone; full: every transformer weight
    max_sequence_length: int | None = Field(None, ge=1)  # pretrained: text tokens (None: the pipeline's default)
    gradient_checkpointing: bool = False  # trade compute for activation memory in the update
    autocast: bool = False  # run the forward under torch.autocast in the run's dtype
    # sample with the LoRA folded into the base weights once per rollout; null: on CUDA only (CPU runs keep
    # the adapter math bit for bit); a merged forward differs from the adapter's by rounding
    merge_lora: bool | None = None
    compile: bool = False  # torch.compile each transformer block (first iteration slower, the rest faster)
    # pretrained: where the text encoders live (spotlight/loop/text_encoders.py): resident on the
    # device all run, or precompute every prompt before the loop and send them away; auto: resident when the
    # memory estimate with them held fits, else precompute. Either way none moves inside the loop
    text_encoders: Literal["auto", "resident", "precompute"] = "auto"

    @model_validator(mode="after")
    def _diffusers_fields_need_a_diffusers_family(self) -> PolicySection:
        if self.family == "tinydit" and self.transformer:
            raise ValueError("model.transformer overrides a diffusers architecture: set model.family to sd3, flux "
                             "or qwen-image, or remove it (a TinyDiT's architecture comes from base_checkpoint)")
        if self.pretrained is not None and self.transformer:
            raise ValueError("model.transformer overrides a tiny architecture; a pretrained pipeline brings its own: "
                             "remove model.transformer or model.pretrained")
        return self

    def pipeline_config(self, task: str, resolution: tuple[int, int] | None, guidance_scale: float,
                        negative_prompt: str, dtype: DTypeName, num_frames: int | None = None,
                        guidance_scale_2: float | None = None) -> DiffusersPolicyConfig:
        """The policy description of the ``pretrained`` pipeline folder; PipelineFolderError for a bad folder.

        ``task`` only names the run's prompt preset (kinds for validation); the prompts themselves are
        encoded by the folder's text encoders.
        """
        if self.pretrained is None:
            raise ValueError("model.pretrained is not set: there is no pipeline folder to describe")
        folder = read_pipeline_folder(self.pretrained)
        if self.family != "tinydit" and self.family != folder.family:
            raise ValueError(f"model.family is {self.family} but {folder.path} holds a {folder.family} pipeline: "
                             f"set model.family to {folder.family} (or leave it out)")
        if num_frames is not None and not folder.is_video:
            raise PipelineFolderError(f"rollout.num_frames applies to a video pipeline folder; {folder.path} holds "
                                      f"a {folder.family} image pipeline: remove rollout.num_frames")
        folder.latent_shape(resolution or folder.default_resolution, num_frames)
        folder.check_guidance_scale_2(guidance_scale, guidance_scale_2)
        return DiffusersPolicyConfig(
            family=folder.family, pretrained=str(folder.path), pipeline=True, resolution=resolution,
            lora_rank=self.lora_rank, lora_alpha=self.lora_alpha, lora_target_modules=self.lora_target_modules,
            finetune=self.finetune, dtype=dtype, guidance_scale=guidance_scale, negative_prompt=negative_prompt,
            max_sequence_length=self.max_sequence_length, gradient_checkpointing=self.gradient_checkpointing,
            autocast=self.autocast, task=task, merge_lora=self.merge_lora, compile=self.compile,
            num_frames=num_frames, guidance_scale_2=guidance_scale_2,
        )

    def diffusers_config(self, task: str, vocab_size: int, image_size: tuple[int, int]) -> DiffusersPolicyConfig:
        """The full description of the diffusers policy this section builds for ``task``'s images and tokens."""
        if self.family == "tinydit":
            raise ValueError("model.family tinydit loads base_checkpoint; there is no diffusers config to build")
        height, width = image_size
        overrides = {**image_geometry(self.family, self.transformer, height, width), **self.transformer}
        return DiffusersPolicyConfig(
            family=self.family, tiny=True, tiny_overrides=overrides, latent_size=height, lora_rank=self.lora_rank,
            lora_alpha=self.lora_alpha, lora_target_modules=self.lora_target_modules, dtype="float32",
            init_seed=self.init_seed, task=task, vocab_size=vocab_size, max_text_len=self.max_text_len,
            finetune=self.finetune, gradient_checkpointing=self.gradient_checkpointing, autocast=self.autocast,
            merge_lora=self.merge_lora, compile=self.compile,
        )
