"""One training iteration's work, from a pipeline folder's configs and the run's training fields.

What `spotlight plan` and `spotlight simulate` know about a model they have not loaded:

- FLOPs of one conditional forward of one sample, and of a forward and backward, counted on the meta
  device (`spotlight.sim.planning.forward_flops`), LoRA's adapters included;
- forwards per image of a rollout: ``rollout.num_steps`` x 2 with true classifier-free guidance (the
  unconditional half rides in the same batch; a guidance-distilled FLUX takes its scale as an input);
- the update, per rollout sample, by each algorithm's own loop:
  - nft (`spotlight.rl.nft`): ``num_epochs`` x ``nft_timesteps`` rows, each one forward of the sampling
    policy θ_old, one forward and backward of θ, and one forward of the frozen reference when
    ``nft_kl_beta`` > 0; CFG-free (DiffusionNFT trains the conditional velocity). Every sample is
    counted, as if none had a zero advantage (the loop skips those: an upper bound);
  - flow-grpo (`spotlight.rl.grpo`): ceil(``timestep_fraction`` x K) of the K SDE steps, each a guided
    forward and backward (two rows with true CFG) and a guided reference forward when ``kl_beta`` > 0;
  - gradient checkpointing adds one more forward per backward (the recompute);
- bytes: the trainer's memory (`spotlight.models.pipelines.memory_estimate`, the estimate `spotlight
  train` prints, with the sizes counted on the meta device) at the largest micro-batch whose estimate
  fits 90% of the GPU, as `choose_micro_batch` picks a run's; gradients all-reduced per optimizer step
  (float32: LoRA's adapters or every weight, as the trainer keeps them); the trained weights broadcast
  to the rollout devices after each update.

A model that fits no micro-batch raises `DoesNotFitError`, one line naming what would make it fit.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from spotlight.models.pipelines.family_config import lora_targets
from spotlight.models.pipelines.folder import PipelineFolder, PipelineFolderError, read_pipeline_folder
from spotlight.models.pipelines.guidance import uses_true_cfg
from spotlight.models.pipelines.memory_estimate import (
    GIB,
    MemoryEstimate,
    ModelSizes,
    estimate_training_memory,
    safetensors_shapes,
    sampling_rows,
    training_rows,
)
from spotlight.sim.planning.analytic.part_parameters import part_parameters as analytic_part_parameters
from spotlight.sim.planning.analytic.trace import NotAnalytic
from spotlight.sim.planning.count_cache import cached
from spotlight.sim.planning.forward_flops import ForwardCount, count_forward_flops, text_tokens
from spotlight.sim.planning.model_folders import resolve_model_folder

if TYPE_CHECKING:
    from spotlight.sim.planning.device_profiles import DeviceProfile

__all__ = ["DoesNotFitError", "FolderWorkload", "RunFields", "derive_workload", "part_parameters", "update_passes"]

DEFAULT_PROMPT_TOKENS = 32  # Qwen-Image: GenEval/OCR-length prompts (PlanSection.prompt_tokens)
FIT_HEADROOM = 0.9  # a micro-batch fits when its estimate is within 90% of the GPU (choose_micro_batch's)
FLOAT32_BYTES = 4  # trained weights, their gradients and LoRA's adapters stay float32 (adapter.py)


class RunFields(Protocol):
    """The training config's fields a plan reads (`spotlight.config`'s sections; the simulator imports none).

    model: pretrained, finetune, lora_rank, lora_target_modules, max_sequence_length,
    gradient_checkpointing; rollout: resolution_hw, num_steps, sde_steps, guidance_scale,
    prompts_per_iteration, group_size; train: algorithm, optimizer, num_epochs, num_minibatches,
    nft_timesteps, nft_kl_beta, kl_beta, timestep_fraction, micro_batch_size, ema_decay, old_policy_decay.
    """

    model: Any
    rollout: Any
    train: Any
    dtype: Any


class DoesNotFitError(ValueError):
    """The model does not fit one GPU at any micro-batch; the message names what would make it fit."""


@dataclass(frozen=True)
class FolderWorkload:
    """What one iteration costs, per image and per GPU (module docstring for each count).

    FLOPs are per sample; ``update_passes`` counts the update's forwards and forward-backwards per
    rollout sample; ``memory`` is the trainer's at ``micro_batch`` rows per forward and backward.
    """

    folder: Path
    family: str
    resolution: tuple[int, int]
    vae_scale_factor: int
    image_tokens: int
    text_tokens: int
    text_tokens_source: str
    forward_flops: float
    train_pass_flops: float
    guidance_forwards: int
    rollout_forwards_per_image: int
    update_passes: dict[str, float]
    update_flops_per_sample: float
    optimizer_steps: int
    parameters: int
    trainable_parameters: int
    text_encoder_parameters: int
    vae_parameters: int
    blocks: int
    hidden: int
    heads: int
    memory: MemoryEstimate
    micro_batch: int
    minibatch_rows: int

    @property
    def rollout_flops_per_image(self) -> float:
        return self.rollout_forwards_per_image * self.forward_flops

    @property
    def gradient_bytes(self) -> int:
        """Bytes all-reduced per optimizer step (float32 gradients of what is trained)."""
        return self.trainable_parameters * FLOAT32_BYTES

    def all_reduce_bytes_per_device(self, devices: int) -> float:
        """Bytes each of ``devices`` data-parallel trainers sends per optimizer step (ring: 2 (n - 1) / n)."""
        return 2.0 * (devices - 1) / devices * self.gradient_bytes

    @property
    def broadcast_bytes(self) -> int:
        """Bytes of trained weights handed to the rollout devices after each update."""
        return self.trainable_parameters * FLOAT32_BYTES


def part_parameters(folder: PipelineFolder, part: str) -> int:
    """Parameters of a pipeline part (text encoder, VAE): its safetensors headers, else counted from its config.

    A folder of configs only (a hub snapshot without weights) has no headers to read, so the part is
    counted from its config.json for the class ``model_index.json`` names, the class diffusers would load
    (`spotlight.sim.planning.analytic.part_parameters`, no model code imported); a class or option that
    module does not write out is built on the meta device instead (no memory, no weights), once per
    config and class (`spotlight.sim.planning.count_cache`).
    """
    directory = folder.path / part
    shapes = safetensors_shapes(directory)
    if shapes:
        return sum(math.prod(shape) for shape in shapes.values())
    if not (directory / "config.json").is_file():
        raise PipelineFolderError(f"{directory} has neither safetensors nor a config.json: Spotlight cannot size the "
                                  f"{part}; pass the pipeline folder with its {part}/config.json")
    library, name = folder.class_name(part)
    text = (directory / "config.json").read_text()
    try:
        return analytic_part_parameters(library, name, json.loads(text))
    except (NotAnalytic, ValueError):
        pass  # the meta-device count (and its one-line errors) below
    counted = cached("parameters", {"config": text, "class": [library, name]},
                     lambda: {"parameters": _meta_parameters(folder, part)})
    return int(counted["parameters"])


def _meta_parameters(folder: PipelineFolder, part: str) -> int:
    """Parameters of ``part`` built on the meta device as diffusers builds it: its model_index.json class
    from its config.json (a diffusers model's ``from_config``, a transformers model's own config class)."""
    import torch

    from spotlight.models.pipelines.folder import component_class

    cls = component_class(folder, part)
    directory = folder.path / part
    with torch.device("meta"):
        if folder.class_name(part)[0] == "transformers":  # a text encoder: its config read by its own config class
            model = cls._from_config(cls.config_class.from_pretrained(str(directory)))
        else:  # a diffusers model (the VAE)
            model = cls.from_config(json.loads((directory / "config.json").read_text()))
    return sum(p.numel() for p in model.parameters())


def update_passes(config: RunFields, guided: bool) -> dict[str, float]:
    """Forwards and forward-backwards of one rollout sample in one update, by algorithm (module docstring)."""
    train, rollout = config.train, config.rollout
    recompute = 1.0 if config.model.gradient_checkpointing else 0.0
    if train.algorithm == "nft":
        rows = float(train.num_epochs * train.nft_timesteps)
        passes = {"forward and backward": rows, "sampling-policy forward": rows}
        if train.nft_kl_beta > 0:
            passes["reference forward"] = rows
    else:
        sde_steps = rollout.num_steps if rollout.sde_steps is None else min(rollout.sde_steps, rollout.num_steps)
        rows = float(max(1, math.ceil(train.timestep_fraction * sde_steps)) * (2 if guided else 1))
        passes = {"forward and backward": rows}
        if train.kl_beta > 0:
            passes["reference forward"] = rows
    if recompute:
        passes["checkpoint recompute forward"] = passes["forward and backward"]
    return passes


def _optimizer_steps(config: RunFields) -> int:
    train = config.train
    return train.num_minibatches * (train.num_epochs if train.algorithm == "nft" else 1)


def _memory(config: RunFields, count: ForwardCount, sizes: ModelSizes, micro_batch: int | None,
            pixels: int = 0) -> MemoryEstimate:
    """`run_memory_estimate`'s estimate at ``micro_batch``, with the sizes counted on the meta device."""
    train, rollout = config.train, config.rollout
    uses_reference = train.kl_beta > 0 if train.algorithm == "flow-grpo" else train.nft_kl_beta > 0
    copies = 1 + (train.ema_decay is not None) + (train.old_policy_decay > 0)
    guided = rollout.guidance_scale > 1
    merged = config.model.merge_lora if config.model.merge_lora is not None else True  # a GPU run's default
    return estimate_training_memory(
        sizes, dtype=config.dtype, finetune=config.model.finetune, optimizer=train.optimizer, frozen_copies=copies,
        reference=uses_reference, tokens=count.image_tokens + count.text_tokens,
        rows=training_rows(config, micro_batch), gradient_checkpointing=config.model.gradient_checkpointing,
        text_tokens=count.text_tokens,
        sample_rows=sampling_rows(rollout) * (2 if guided else 1),
        merged_lora=merged, pixels=pixels)


def _fit(config: RunFields, count: ForwardCount, sizes: ModelSizes, pixels: int,
         device: DeviceProfile) -> tuple[MemoryEstimate, int]:
    """The estimate at the largest micro-batch whose estimate fits 90% of the GPU (as `choose_micro_batch`
    picks it for a run), at most ``train.micro_batch_size`` when set; that micro-batch."""
    largest = training_rows(config, None)
    if config.train.algorithm == "flow-grpo" and config.rollout.guidance_scale > 1:
        largest //= 2
    if config.train.micro_batch_size is not None:
        largest = min(largest, config.train.micro_batch_size)
    budget = FIT_HEADROOM * device.memory_bytes
    best, low, high = None, 1, max(largest, 1)
    while low <= high:  # the estimate grows with the rows: bisect for the largest that fits
        middle = (low + high) // 2
        if _memory(config, count, sizes, middle, pixels).total <= budget:
            best, low = middle, middle + 1
        else:
            high = middle - 1
    if best is None:
        raise DoesNotFitError(_what_would_fit(config, _memory(config, count, sizes, 1, pixels), device))
    return _memory(config, count, sizes, best, pixels), best


def _what_would_fit(config: RunFields, estimate: MemoryEstimate, device: DeviceProfile) -> str:
    parts = estimate.parts
    fixes = []
    if config.model.finetune == "full":
        fixes.append("model.finetune=lora")
        shardable = parts["transformer"] + parts["gradients"] + parts["optimizer"] + parts["frozen copies"]
        rest = estimate.total - shardable
        if rest < device.memory_bytes:
            ranks = math.ceil(shardable / (device.memory_bytes - rest))
            fixes.append(f"FSDP over {ranks} GPUs (trainer.devices={ranks} trainer.sharding=fsdp)")
    if not config.model.gradient_checkpointing:
        fixes.append("model.gradient_checkpointing=true")
    if estimate.peak_phase == "sampling" and sampling_rows(config.rollout) > 1:
        fixes.append("a lower rollout.sample_batch (rows per sampling forward)")
    fixes.append("a lower rollout.resolution")
    return (f"{config.model.pretrained} does not fit one {device.name} ({device.memory_gb:g} GB) at micro-batch 1: "
            f"the trainer needs {estimate.total / GIB:.1f} GiB ({estimate.summary().split(': ', 1)[1]}); "
            f"try {', or '.join(fixes)}")


def derive_workload(config: RunFields, device: DeviceProfile, prompt_tokens: int | None = None) -> FolderWorkload:
    """The iteration's work for ``config`` (its ``model.pretrained`` folder) on ``device``.

    ``prompt_tokens``: Qwen-Image's prompt length (an assumption); None: ``config.plan.prompt_tokens``
    (`spotlight.sim.planning.folder_sim.PlanSection`) when the config has one, else 32.

    Raises PipelineFolderError / UnknownTransformerError for a folder or resolution Spotlight cannot
    take, and DoesNotFitError when no micro-batch fits the GPU; each in one line.
    """
    if config.model.pretrained is None:
        raise ValueError("model.pretrained is not set: pass -s model.pretrained=FOLDER (a diffusers pipeline folder, "
                         "weights optional) or a shipped config name such as sd3.5-medium")
    folder: PipelineFolder = read_pipeline_folder(resolve_model_folder(config.model.pretrained))
    resolution = config.rollout.resolution_hw or folder.default_resolution
    if prompt_tokens is None:
        plan = getattr(config, "plan", None)
        prompt_tokens = plan.prompt_tokens if plan is not None else DEFAULT_PROMPT_TOKENS
    tokens = text_tokens(folder, config.model.max_sequence_length, prompt_tokens)
    source = ("the prompt's tokens (plan.prompt_tokens, an assumption) + the chat template's 5"
              if folder.family == "qwen-image" else "padded to the pipeline's max_sequence_length")
    lora = None
    if config.model.finetune == "lora":
        lora = (config.model.lora_rank, lora_targets(folder.family, config.model.lora_target_modules))
    count = count_forward_flops(folder, resolution, tokens, batch=1, lora=lora, backward=True,
                                num_frames=config.rollout.num_frames)
    assert count.train_flops is not None  # asked for with backward=True
    guided = uses_true_cfg(folder.family, config.rollout.guidance_scale,
                           bool(folder.transformer.get("guidance_embeds", False)))
    passes = update_passes(config, guided)
    update_flops = (passes["forward and backward"] * count.train_flops
                    + sum(rows for name, rows in passes.items() if name != "forward and backward") * count.flops)
    transformer = folder.transformer
    blocks = int(transformer.get("num_layers", 0)) + int(transformer.get("num_single_layers", 0))
    heads = int(transformer["num_attention_heads"])
    hidden = heads * int(transformer["attention_head_dim"])
    text = sum(part_parameters(folder, part) for part in folder.components if part.startswith("text_encoder"))
    vae = part_parameters(folder, "vae")
    vae_channels = int(folder.vae.get("base_dim") or (folder.vae.get("block_out_channels") or [0])[0])
    # Wan2.2 A14B's experts share one architecture: a forward runs one (its FLOPs), the run holds and trains both
    experts = len(folder.experts)
    parameters, lora_parameters = experts * count.parameters, experts * count.lora_parameters
    sizes = ModelSizes(transformer=parameters, text_encoders=text, vae=vae, lora=lora_parameters,
                       blocks=blocks, hidden=hidden, lora_inputs=count.lora_inputs,
                       lora_weights=experts * count.lora_weights, vae_channels=vae_channels)
    memory, micro = _fit(config, count, sizes, resolution[0] * resolution[1], device)
    rows = training_rows(config, None)
    trainable = parameters if config.model.finetune == "full" else lora_parameters
    return FolderWorkload(
        folder=folder.path, family=folder.family, resolution=tuple(resolution),
        vae_scale_factor=folder.vae_scale_factor, image_tokens=count.image_tokens,
        text_tokens=tokens, text_tokens_source=source, forward_flops=count.flops, train_pass_flops=count.train_flops,
        guidance_forwards=2 if guided else 1,
        rollout_forwards_per_image=config.rollout.num_steps * (2 if guided else 1),
        update_passes=passes, update_flops_per_sample=update_flops, optimizer_steps=_optimizer_steps(config),
        parameters=parameters, trainable_parameters=trainable, text_encoder_parameters=text,
        vae_parameters=vae, blocks=blocks, hidden=hidden, heads=heads, memory=memory, micro_batch=micro,
        minibatch_rows=rows)
