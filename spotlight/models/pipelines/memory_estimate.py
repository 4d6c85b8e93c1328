"""How much accelerator memory a training run needs, from a pipeline folder's files, before any weight loads.

A user about to post-train a 20 B model wants to know whether it fits before it fails an hour in. This
reads the parameter shapes from the safetensors headers of ``transformer/``, ``text_encoder*/`` and
``vae/`` (a few kilobytes each, no weights), and adds up what the trainer's device holds:

- weights: the frozen transformer in the run's dtype (full fine-tuning: float32, as it trains), the
  text encoders and the VAE in the run's dtype;
- trained tensors: LoRA's A and B (rank r on every targeted Linear of shape (out, in): r (in + out)
  parameters) or every transformer weight, in float32, with their float32 gradients and the
  optimizer's state (AdamW: two moments; SGD: one momentum);
- frozen versions: the EMA, θ_old and θ_{i-1} (`spotlight.models.shadow`: LoRA tensors each, or full
  float32 copies when fully fine-tuned, plus the reference base);
- activations of one forward/backward: Korthikanti et al. 2022 ("Reducing Activation Recomputation in
  Large Transformer Models") count 34 bytes per token per hidden unit per layer at 2-byte activations
  for a layer with a 4x MLP (34 s b h); the attention-score term (5 a s^2 b) is left out because SDPA's
  fused kernels keep no score matrix. With gradient checkpointing each block keeps only its input
  (2 s b h bytes at 2-byte activations) and one block's activations are live during the recompute.
  Tokens are the image tokens at the resolution (latents packed 2x2) plus the text tokens.

It is an estimate, not a measurement (allocator fragmentation, the sampler's own buffers and kernels'
workspaces come on top): ``benchmarks/gpu_smoke.py`` measures the real peak where a GPU exists.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from spotlight.config import TrainConfig

__all__ = ["MemoryEstimate", "ModelSizes", "cuda_memory_bytes", "estimate_training_memory", "lora_parameter_count",
           "model_sizes", "run_memory_estimate", "safetensors_shapes"]

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ACTIVATION_BYTES_PER_TOKEN_UNIT = 34  # per layer, at 2-byte activations (Korthikanti et al. 2022)
CHECKPOINTED_BYTES_PER_TOKEN_UNIT = 2  # a checkpointed block keeps its input only
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1}
CLIP_TOKENS = 77  # SD3 puts its CLIP tokens before the T5 tokens in one sequence


def safetensors_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape in the ``*.safetensors`` files of ``folder`` (shards too), read from their headers."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        shapes.update({name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"})
    return shapes


def _count(shapes: Mapping[str, tuple[int, ...]]) -> int:
    return sum(math.prod(shape) for shape in shapes.values())


def lora_parameter_count(shapes: Mapping[str, tuple[int, ...]], targets: Iterable[str], rank: int) -> int:
    """LoRA parameters on every Linear whose module name is a target or ends with ``.target`` (peft's rule)."""
    targets = tuple(targets)
    total = 0
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and len(shape) == 2 and any(module == t or module.endswith(f".{t}") for t in targets):
            out_features, in_features = shape
            total += rank * (in_features + out_features)
    return total


@dataclass(frozen=True)
class ModelSizes:
    """Parameter counts of a pipeline's parts and the transformer's depth and width (for activations)."""

    transformer: int
    text_encoders: int
    vae: int
    lora: int
    blocks: int
    hidden: int


def model_sizes(folder: str | Path, targets: Iterable[str], rank: int) -> ModelSizes:
    """`ModelSizes` of a diffusers pipeline folder, from its config and safetensors headers alone."""
    folder = Path(folder)
    transformer_shapes = safetensors_shapes(folder / "transformer")
    config = json.loads((folder / "transformer" / "config.json").read_text())
    text = sum(_count(safetensors_shapes(part)) for part in sorted(folder.glob("text_encoder*")) if part.is_dir())
    blocks = int(config.get("num_layers", 0)) + int(config.get("num_single_layers", 0))
    hidden = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    return ModelSizes(transformer=_count(transformer_shapes), text_encoders=text,
                      vae=_count(safetensors_shapes(folder / "vae")),
                      lora=lora_parameter_count(transformer_shapes, targets, rank), blocks=blocks, hidden=hidden)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part of the trainer's device memory (``parts``), their total, and a one-line summary."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def summary(self, device_bytes: int | None = None) -> str:
        """``memory estimate (trainer device): transformer 4.6 GiB + ... = 21.3 GiB``: what a run prints at start.

        With ``device_bytes`` (the accelerator's memory) an estimate above it says so, and what to change.
        """
        shown = " + ".join(f"{name} {_size(value)}" for name, value in self.parts.items() if value)
        line = f"memory estimate (trainer device): {shown} = {_size(self.total)}"
        if device_bytes is not None and self.total > device_bytes:
            line += (f"; more than the device's {_size(device_bytes)}: set model.gradient_checkpointing=true, "
                     "raise train.num_minibatches or lower rollout.resolution")
        return line


def _size(count: int) -> str:
    return f"{count / GIB:.1f} GiB" if count >= GIB / 10 else f"{count / 1024**2:.1f} MiB"


def cuda_memory_bytes(device: str) -> int | None:
    """The memory of the first CUDA device when ``device`` is cuda and one exists; else None."""
    import torch

    if device != "cuda" or not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(0).total_memory)


def estimate_training_memory(sizes: ModelSizes, *, dtype: Literal["float32", "bfloat16", "float16"],
                             finetune: Literal["lora", "full"], optimizer: Literal["adamw", "sgd"],
                             frozen_copies: int, reference: bool, tokens: int, rows: int,
                             gradient_checkpointing: bool) -> MemoryEstimate:
    """The memory of one training process (module docstring).

    ``frozen_copies``: how many of the EMA, θ_old and θ_{i-1} the loop keeps; ``reference``: whether the
    update has a frozen base (free with LoRA: the adapter disabled); ``tokens``: image + text tokens of
    one sample; ``rows``: samples in one forward/backward (the minibatch or micro-batch; doubled for a
    guided update).
    """
    unit = DTYPE_BYTES[dtype]
    full = finetune == "full"
    trained = sizes.transformer if full else sizes.lora
    per_layer = (CHECKPOINTED_BYTES_PER_TOKEN_UNIT if gradient_checkpointing else ACTIVATION_BYTES_PER_TOKEN_UNIT)
    activations = per_layer * tokens * sizes.hidden * sizes.blocks * rows * unit // 2
    if gradient_checkpointing:  # the block being recomputed holds its full activations
        activations += ACTIVATION_BYTES_PER_TOKEN_UNIT * tokens * sizes.hidden * rows * unit // 2
    copies = frozen_copies + (1 if full and reference else 0)
    return MemoryEstimate(parts={
        "transformer": sizes.transformer * (4 if full else unit),
        "text encoders": sizes.text_encoders * unit,
        "vae": sizes.vae * unit,
        "trained": 0 if full else trained * 4,  # full: the transformer's own float32 weights, counted above
        "gradients": trained * 4,
        "optimizer": trained * 4 * OPTIMIZER_STATES[optimizer],
        "frozen copies": copies * trained * 4,
        "activations": activations,
    })


def run_memory_estimate(config: TrainConfig) -> MemoryEstimate | None:
    """The estimate for a training config with ``model.pretrained``.

    None for the toy models (they fit anywhere) and for a folder or resolution that does not fit: the
    run's start-up reports that in its own one line.
    """
    from spotlight.models.pipelines.family_config import DEFAULT_LORA_TARGETS
    from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder
    from spotlight.models.pipelines.prompts import DEFAULT_MAX_SEQUENCE_LENGTH

    section = config.model
    if section.pretrained is None:
        return None
    try:
        folder = read_pipeline_folder(section.pretrained)
        height, width = folder.latent_size(config.rollout.resolution_hw or folder.default_resolution)
    except PipelineFolderError:
        return None
    text_tokens = section.max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH[folder.family]
    if folder.family == "sd3":
        text_tokens += CLIP_TOKENS
    train = config.train
    rows = math.ceil(config.rollout.prompts_per_iteration * config.rollout.group_size / train.num_minibatches)
    if train.micro_batch_size is not None:  # a minibatch's forward/backward runs in slices of this many rows
        rows = min(rows, train.micro_batch_size)
    if train.algorithm == "flow-grpo" and config.rollout.guidance_scale > 1:
        rows *= 2  # the guided step's log-prob: conditional and unconditional halves in one batch
    uses_reference = train.kl_beta > 0 if train.algorithm == "flow-grpo" else train.nft_kl_beta > 0
    copies = 1 + (train.ema_decay is not None) + (train.old_policy_decay > 0)
    sizes = model_sizes(folder.path, section.lora_target_modules or DEFAULT_LORA_TARGETS, section.lora_rank)
    return estimate_training_memory(
        sizes, dtype=config.dtype, finetune=section.finetune, optimizer=train.optimizer, frozen_copies=copies,
        reference=uses_reference, tokens=height * width // 4 + text_tokens, rows=rows,
        gradient_checkpointing=section.gradient_checkpointing)
