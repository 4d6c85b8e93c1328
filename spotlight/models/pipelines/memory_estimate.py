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
  Tokens are the image tokens at the resolution (latents packed 2x2) plus the text tokens. The rows
  are the update's micro-batch: the minibatch's samples times NFT's ``nft_timesteps`` noise levels (each
  sample is trained at several), doubled for a guided Flow-GRPO step;
- LoRA's float32 inputs: peft casts each targeted Linear's input to the adapters' float32 and the A
  matrix keeps that copy for its backward, 4 bytes per input feature per token of the layer's stream
  (image, text, or both for a single-stream block), for every targeted layer, beside the 34 s b h;
- and, not at the same time as the update (the largest of them counts): the rollout's sampling forward
  (no autograd: about ten hidden-width tensors per token live in a block, for every sample of one
  forward, the rollout's samples in chunks of ``rollout.sample_batch`` (`sampling_rows`), twice that with
  true CFG, plus the merged copies of the targeted weights when the LoRA is folded in for sampling), the
  VAE decoding ``DECODE_BATCH`` images (about four feature maps of its first block's channels at full
  resolution), and the text encoders, which are on the device only while new prompts are encoded
  (`PromptCache` offloads them after);
- the CUDA context (about half a GiB whatever the model).

Measured against this (issue 32, H200, Qwen-Image architecture, 8 images at 512²): 92 GB peak against an
estimate of 57.0 GiB that lacked the ``nft_timesteps`` factor, the float32 LoRA inputs and the context.

It is an estimate, not a measurement (allocator fragmentation, the sampler's own buffers and kernels'
workspaces come on top): ``benchmarks/gpu/gpu_smoke.py`` measures the real peak where a GPU exists.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# the run's config arrives as Any (a spotlight.config.TrainConfig): models/ sits below the configuration
TrainConfig = Any

__all__ = ["LOWER_MEMORY", "MemoryEstimate", "ModelSizes", "choose_micro_batch", "cuda_memory_bytes",
           "estimate_training_memory", "lora_input_features", "lora_parameter_count", "model_sizes",
           "out_of_memory_message", "run_memory_estimate", "safetensors_shapes", "sampling_rows", "training_rows",
           "with_estimated_micro_batch"]

logger = logging.getLogger(__name__)
GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ACTIVATION_BYTES_PER_TOKEN_UNIT = 34  # per layer, at 2-byte activations (Korthikanti et al. 2022)
CHECKPOINTED_BYTES_PER_TOKEN_UNIT = 2  # a checkpointed block keeps its input only
OPTIMIZER_STATES = {"adamw": 2, "sgd": 1}
CLIP_TOKENS = 77  # SD3 puts its CLIP tokens before the T5 tokens in one sequence
LORA_INPUT_BYTES = 4  # peft's float32 copy of a targeted Linear's input, kept for the A matrix's backward
SAMPLING_TENSORS_PER_TOKEN = 10  # hidden-width tensors live in one block of a no-grad forward (4h MLP x2, q k v, ...)
DECODE_BATCH = 8  # images per VAE decode (LatentDecoder.batch_size)
DECODE_MAPS = 4  # full-resolution feature maps live in the VAE decoder's last block
CUDA_CONTEXT_BYTES = GIB // 2


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


def _targeted(shapes: Mapping[str, tuple[int, ...]], targets: Iterable[str]) -> dict[str, tuple[int, int]]:
    """(out, in) of every Linear weight whose module is a target or ends with ``.target`` (peft's rule)."""
    targets = tuple(targets)
    found = {}
    for name, shape in shapes.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and len(shape) == 2 and any(module == t or module.endswith(f".{t}") for t in targets):
            found[module] = (int(shape[0]), int(shape[1]))
    return found


def lora_input_features(shapes: Mapping[str, tuple[int, ...]], targets: Iterable[str]) -> tuple[int, int, int]:
    """Summed input features of the targeted Linears by the tokens they see: (image stream, text stream, both).

    Dual-stream blocks project text tokens through their ``add_*`` / ``to_add_out`` layers and image tokens
    through the rest; a single-stream block (FLUX's ``single_transformer_blocks``) sees every token.
    """
    image = text = joint = 0
    for module, (_, in_features) in _targeted(shapes, targets).items():
        leaf = module.rsplit(".", 1)[-1]
        if module.startswith("single_transformer_blocks"):
            joint += in_features
        elif leaf.startswith("add_") or leaf == "to_add_out" or module.endswith(("attn2.to_k", "attn2.to_v")):
            text += in_features  # (Wan's cross-attention attn2 takes its keys and values from the text)
        else:
            image += in_features
    return image, text, joint


def lora_parameter_count(shapes: Mapping[str, tuple[int, ...]], targets: Iterable[str], rank: int) -> int:
    """LoRA parameters on every Linear whose module name is a target or ends with ``.target`` (peft's rule)."""
    return sum(rank * (in_features + out_features) for out_features, in_features in _targeted(shapes, targets).values())


@dataclass(frozen=True)
class ModelSizes:
    """Parameter counts of a pipeline's parts and the transformer's depth and width (for activations)."""

    transformer: int
    text_encoders: int
    vae: int
    lora: int
    blocks: int
    hidden: int
    lora_inputs: tuple[int, int, int] = (0, 0, 0)  # `lora_input_features`: image, text, both streams
    lora_weights: int = 0  # elements of the targeted weights (what a merged-LoRA rollout copies)
    vae_channels: int = 0  # the VAE decoder's full-resolution channels


def model_sizes(folder: str | Path, targets: Iterable[str], rank: int) -> ModelSizes:
    """`ModelSizes` of a diffusers pipeline folder, from its config and safetensors headers alone.

    The folder is read as diffusers reads it (`spotlight.models.pipelines.folder`): the text encoders are the
    ones model_index.json lists, and a key a config leaves out is its class's default.
    """
    from spotlight.models.pipelines.folder import read_pipeline_folder

    pipeline = read_pipeline_folder(folder)
    folder = pipeline.path
    transformer_shapes = safetensors_shapes(folder / "transformer")
    config = pipeline.transformer
    text = sum(_count(safetensors_shapes(folder / part)) for part in pipeline.components
               if part.startswith("text_encoder"))
    blocks = int(config.get("num_layers", 0)) + int(config.get("num_single_layers", 0))
    hidden = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    targeted = _targeted(transformer_shapes, targets)
    vae_config = pipeline.vae
    vae_channels = int(vae_config.get("base_dim") or (vae_config.get("block_out_channels") or [0])[0])
    # Wan2.2 A14B's two experts share one architecture: both are held (and adapted), one runs per forward
    experts = len(pipeline.experts)
    return ModelSizes(transformer=experts * _count(transformer_shapes), text_encoders=text,
                      vae=_count(safetensors_shapes(folder / "vae")),
                      lora=experts * lora_parameter_count(transformer_shapes, targets, rank), blocks=blocks,
                      hidden=hidden, lora_inputs=lora_input_features(transformer_shapes, targets),
                      lora_weights=experts * sum(out * inp for out, inp in targeted.values()),
                      vae_channels=vae_channels)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per part of the trainer's device memory: ``parts`` held throughout, ``phases`` one at a time.

    The total is every part plus the largest phase (the update's activations, the rollout's sampling,
    the VAE decode, the text encoding): the phases follow each other, so only one is live at a time.
    ``peaks``: whole moments outside that pattern, each a total of its own (under FSDP2: the start-up, when
    the loaded float32 transformer becomes shards before any gradient or moment exists, and the refresh of
    the sampling copy); the total is the largest of them and parts plus the largest phase.
    """

    parts: dict[str, int]
    phases: dict[str, int] = field(default_factory=dict)
    peaks: dict[str, int] = field(default_factory=dict)

    @property
    def peak_phase(self) -> str | None:
        """The phase that sets the peak (None without phases)."""
        return max(self.phases, key=self.phases.__getitem__) if self.phases else None

    @property
    def running(self) -> int:
        """Every part plus the largest phase: the memory of an iteration."""
        return sum(self.parts.values()) + (self.phases[self.peak_phase] if self.phases else 0)

    @property
    def total(self) -> int:
        return max([self.running, *self.peaks.values()])

    def summary(self, device_bytes: int | None = None) -> str:
        """``memory estimate (trainer device): transformer 4.6 GiB + ... + update activations 9.1 GiB (the
        largest phase; sampling 2.0 GiB, ...) = 21.3 GiB``: what a run prints at start.

        With ``device_bytes`` (the accelerator's memory) an estimate above it says so, and what to change.
        """
        shown = " + ".join(f"{name} {_size(value)}" for name, value in self.parts.items() if value)
        peak = self.peak_phase
        if peak is not None:
            others = ", ".join(f"{name} {_size(value)}" for name, value in self.phases.items()
                               if name != peak and value)
            shown += f" + {peak} {_size(self.phases[peak])} (the largest phase{'; ' + others if others else ''})"
        line = f"memory estimate (trainer device): {shown} = {_size(self.running)}"
        if self.peaks:
            line += "; " + ", ".join(f"{name} peak {_size(value)}" for name, value in self.peaks.items())
            if self.total > self.running:
                line += f": {_size(self.total)} in all"
        if device_bytes is not None and self.total > device_bytes:
            line += (f"; more than the device's {_size(device_bytes)}: {LOWER_MEMORY}")
        return line


LOWER_MEMORY = ("lower train.micro_batch_size or rollout.sample_batch, set model.gradient_checkpointing=true, or lower "
                "rollout.resolution or rollout.group_size")


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
                             gradient_checkpointing: bool, text_tokens: int = 0, sample_rows: int = 0,
                             merged_lora: bool = False, pixels: int = 0, shards: int | None = None,
                             whole_bytes: int = 4) -> MemoryEstimate:
    """The memory of one training process (module docstring).

    ``frozen_copies``: how many of the EMA, θ_old and θ_{i-1} the loop keeps; ``reference``: whether the
    update has a frozen base (free with LoRA: the adapter disabled); ``tokens``: image + text tokens of
    one sample, ``text_tokens`` of them text; ``rows``: samples in one forward/backward (the micro-batch,
    times NFT's noise levels, doubled for a guided update); ``sample_rows``: samples in one sampling
    forward (the rollout, doubled with true CFG; 0: no sampling phase); ``merged_lora``: the rollout
    folds the LoRA into copies of the targeted weights; ``pixels``: H x W of a decoded image (0: no VAE).

    ``shards``: a full fine-tune under FSDP2 on that many ranks (None: no FSDP; `spotlight.ranks.sharded_versions`):
    θ, its gradients and moments and every frozen copy are 1/shards on each rank, beside one whole copy
    of the transformer to sample with and two blocks gathered at a time, both ``whole_bytes`` a parameter
    (``trainer.whole_dtype``). Its ``peaks``: the start-up (`ShardedVersions` walks the loaded float32
    transformer one block at a time, each block's shards made and its float32 weights replaced by
    ``whole_bytes`` ones: the larger of the loaded float32 transformer beside one block's shards and the
    sampling copy beside every shard of θ and of the frozen copies and one block still in float32; no
    gradient or moment exists yet) and the
    refresh of the sampling copy after an update (one block gathered in ``whole_bytes`` into it: FSDP2's
    ``unshard`` holds the shard it sends, the all-gather's output and the block's tensors it copies out; the
    training state all held).
    """
    unit = DTYPE_BYTES[dtype]
    full = finetune == "full"
    trained = sizes.transformer if full else sizes.lora
    per_layer = (CHECKPOINTED_BYTES_PER_TOKEN_UNIT if gradient_checkpointing else ACTIVATION_BYTES_PER_TOKEN_UNIT)
    activations = per_layer * tokens * sizes.hidden * sizes.blocks * rows * unit // 2
    image_inputs, text_inputs, joint_inputs = sizes.lora_inputs
    lora_inputs = 0 if full else LORA_INPUT_BYTES * rows * (
        image_inputs * (tokens - text_tokens) + text_inputs * text_tokens + joint_inputs * tokens)
    if gradient_checkpointing:  # the block being recomputed holds its full activations (and its LoRA inputs)
        activations += ACTIVATION_BYTES_PER_TOKEN_UNIT * tokens * sizes.hidden * rows * unit // 2
        lora_inputs //= max(sizes.blocks, 1)
    copies = frozen_copies + (1 if full and reference else 0)
    sampling = SAMPLING_TENSORS_PER_TOKEN * sample_rows * tokens * sizes.hidden * unit
    if merged_lora and not full:
        sampling += sizes.lora_weights * unit
    if full and shards is not None:  # FSDP2: the training state sharded, one whole copy
        block = sizes.transformer // max(sizes.blocks, 1)
        shard_bytes = (1 + copies) * trained * 4 // shards  # θ and every frozen copy, float32
        parts = {
            "transformer (whole, sampling)": sizes.transformer * whole_bytes,
            "vae": sizes.vae * unit,
            "trained shard": trained * 4 // shards,
            "gradients": trained * 4 // shards,
            "optimizer": trained * 4 * OPTIMIZER_STATES[optimizer] // shards,
            "frozen copies": copies * trained * 4 // shards,
            "gathered blocks": 2 * sizes.transformer * whole_bytes // max(sizes.blocks, 1),
            "cuda context": CUDA_CONTEXT_BYTES,
        }
        # the first block: the loaded float32 transformer and that block's shards; the last: the sampler, every
        # shard and that block still in float32 (each tensor cast frees its float32 storage at once)
        startup = CUDA_CONTEXT_BYTES + max(sizes.transformer * 4 + (1 + copies) * block * 4 // shards,
                                           sizes.transformer * whole_bytes + shard_bytes + (4 - whole_bytes) * block)
        # FSDP2's unshard of one block: its bf16 shard, the all-gather's output and the block's params copied out
        refresh = sum(parts.values()) - parts["gathered blocks"] + block * whole_bytes * (2 * shards + 1) // shards
        return MemoryEstimate(
            parts=parts,
            phases={
                "update activations": activations,
                "sampling": sampling,
                "vae decode": DECODE_MAPS * DECODE_BATCH * pixels * sizes.vae_channels * unit,
                "text encoders": sizes.text_encoders * unit,
            },
            peaks={"start-up": startup, "refresh": refresh},
        )
    return MemoryEstimate(
        parts={
            "transformer": sizes.transformer * (4 if full else unit),
            "vae": sizes.vae * unit,
            "trained": 0 if full else trained * 4,  # full: the transformer's own float32 weights, counted above
            "gradients": trained * 4,
            "optimizer": trained * 4 * OPTIMIZER_STATES[optimizer],
            "frozen copies": copies * trained * 4,
            "cuda context": CUDA_CONTEXT_BYTES,
        },
        phases={
            "update activations": activations + lora_inputs,
            "sampling": sampling,
            "vae decode": DECODE_MAPS * DECODE_BATCH * pixels * sizes.vae_channels * unit,
            "text encoders": sizes.text_encoders * unit,  # on the device while encoding only (offloaded after)
        },
    )


def training_rows(config: TrainConfig, micro_batch_size: int | None) -> int:
    """Rows in one of the update's forward/backward passes: the minibatch (NFT: times its noise levels) or the
    micro-batch when smaller, doubled for Flow-GRPO's guided step (conditional and unconditional halves)."""
    train = config.train
    rows = math.ceil(config.rollout.prompts_per_iteration * config.rollout.group_size / train.num_minibatches)
    if train.algorithm == "nft":
        rows *= train.nft_timesteps  # each sample is trained at nft_timesteps noise levels in one minibatch
    if micro_batch_size is not None:  # a minibatch's forward/backward runs in slices of this many rows
        rows = min(rows, micro_batch_size)
    if train.algorithm == "flow-grpo" and config.rollout.guidance_scale > 1:
        rows *= 2
    return rows


def sampling_rows(rollout: Any) -> int:
    """Samples in one of the rollout's sampling forwards (before true CFG doubles it): the rollout's samples, in
    chunks of ``rollout.sample_batch`` (`spotlight.models.generation.generate` samples them so)."""
    return min(rollout.prompts_per_iteration * rollout.group_size, rollout.sample_batch)


def run_memory_estimate(config: TrainConfig, micro_batch_size: int | None = None) -> MemoryEstimate | None:
    """The estimate for a training config with ``model.pretrained`` (``micro_batch_size``: in place of the config's).

    None for the toy models (they fit anywhere) and for a folder or resolution that does not fit: the
    run's start-up reports that in its own one line.
    """
    from spotlight.models.pipelines.family_config import lora_targets
    from spotlight.models.pipelines.folder import PipelineFolderError, read_pipeline_folder
    from spotlight.models.pipelines.prompts import DEFAULT_MAX_SEQUENCE_LENGTH

    section = config.model
    if section.pretrained is None:
        return None
    try:
        folder = read_pipeline_folder(section.pretrained)
        image_tokens = folder.image_tokens(config.rollout.resolution_hw or folder.default_resolution,
                                           config.rollout.num_frames)  # a video's: every latent frame's
    except PipelineFolderError:
        return None
    text_tokens = section.max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH[folder.family]
    if folder.family == "sd3":
        text_tokens += CLIP_TOKENS
    train = config.train
    micro = train.micro_batch_size if micro_batch_size is None else micro_batch_size
    uses_reference = train.kl_beta > 0 if train.algorithm == "flow-grpo" else train.nft_kl_beta > 0
    copies = 1 + (train.ema_decay is not None) + (train.old_policy_decay > 0)
    sizes = model_sizes(folder.path, lora_targets(folder.family, section.lora_target_modules), section.lora_rank)
    guided = config.rollout.guidance_scale > 1  # true CFG doubles the sampling batch (a guidance-distilled FLUX not)
    merged = section.merge_lora if section.merge_lora is not None else config.device == "cuda"
    pixel_height, pixel_width = config.rollout.resolution_hw or folder.default_resolution
    return estimate_training_memory(
        sizes, dtype=config.dtype, finetune=section.finetune, optimizer=train.optimizer, frozen_copies=copies,
        reference=uses_reference, tokens=image_tokens + text_tokens, rows=training_rows(config, micro),
        gradient_checkpointing=section.gradient_checkpointing, text_tokens=text_tokens,
        sample_rows=sampling_rows(config.rollout) * (2 if guided else 1), merged_lora=merged,
        pixels=pixel_height * pixel_width, **fsdp_layout(config))


def fsdp_layout(config: TrainConfig) -> dict[str, int]:
    """How an FSDP2 run spreads the memory: its ranks (``shards``) and the bytes of a whole weight; {} otherwise."""
    trainer = config.trainer
    if trainer.sharding != "fsdp":
        return {}
    return {"shards": trainer.devices, "whole_bytes": DTYPE_BYTES[trainer.whole_dtype or "float32"]}


def choose_micro_batch(config: TrainConfig, device_bytes: int, headroom: float = 0.9) -> int | None:
    """The largest ``train.micro_batch_size`` whose estimate fits ``headroom`` of ``device_bytes`` (None: no
    estimate, or not even one row fits; the run then starts as configured and its estimate says why)."""
    largest = training_rows(config, None)
    if config.train.algorithm == "flow-grpo" and config.rollout.guidance_scale > 1:
        largest //= 2
    best = None
    low, high = 1, max(largest, 1)
    while low <= high:  # the estimate grows with the rows: bisect for the largest that fits
        middle = (low + high) // 2
        estimate = run_memory_estimate(config, micro_batch_size=middle)
        if estimate is None:
            return None
        if estimate.total <= headroom * device_bytes:
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best


def with_estimated_micro_batch(config: TrainConfig) -> TrainConfig:
    """``config`` with ``train.micro_batch_size`` chosen by `choose_micro_batch` for a CUDA run of a pipeline
    folder that leaves it null (as configured otherwise: a CPU run, a set micro-batch, no estimate)."""
    if config.device != "cuda" or config.train.micro_batch_size is not None:
        return config
    device_bytes = cuda_memory_bytes(config.device)
    chosen = None if device_bytes is None else choose_micro_batch(config, device_bytes)
    if chosen is None:
        return config
    logger.info(f"train.micro_batch_size={chosen}: the largest whose memory estimate fits 90% of the GPU's "
                f"{_size(device_bytes or 0)}")
    return config.model_copy(update={"train": config.train.model_copy(update={"micro_batch_size": chosen})})


def out_of_memory_message(config: TrainConfig, error: BaseException) -> str:
    """One line for a CUDA out-of-memory error: what ran out, the start-up estimate, and the knobs that lower it."""
    first = (str(error).strip().splitlines() or ["out of memory"])[0]
    estimate = run_memory_estimate(config)
    expected = ("no estimate (it covers pipeline folders)" if estimate is None
                else f"the start-up estimate was {_size(estimate.total)}, its largest phase {estimate.peak_phase}")
    micro = config.train.micro_batch_size
    return (f"the GPU ran out of memory ({first[:160]}); {expected}: lower train.micro_batch_size "
            f"(now {'the whole minibatch' if micro is None else micro}) or rollout.sample_batch (now "
            f"{config.rollout.sample_batch}), set model.gradient_checkpointing=true, "
            f"or lower rollout.resolution or rollout.group_size")
