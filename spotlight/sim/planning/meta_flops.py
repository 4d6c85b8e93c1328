"""FLOPs of one transformer forward of a pipeline folder, counted by torch on the meta device: the reference.

`spotlight.sim.planning.forward_flops` counts from the config (`spotlight.sim.planning.analytic`); this
module builds the family's diffusers class under ``torch.device("meta")`` instead (shapes only: a folder
of configs alone works), runs one forward on meta inputs of the shapes the pipeline would pass, and
``torch.utils.flop_counter.FlopCounterMode`` counts it, attention included (SDPA on meta goes through its
maths decomposition, two batched matmuls of 2·b·h·s²·d each, the same count torch's flash-attention
formula gives on a GPU). It is what the analytic counts are tested against, and what `plan` falls back
to for a config the analytic walk does not model (it imports diffusers and peft: seconds).

Only one block of each kind runs. A meta forward of 60 blocks costs seconds of Python dispatch, and the
blocks of one ``ModuleList`` with the same parameter shapes do the same work on the same sequence: so each
list keeps the first block of every distinct shape signature (SD3.5-Medium: a dual-attention block, a plain
one, the last context-pre-only one), in order, and each counted block's FLOPs are multiplied by how many
blocks share its signature. The model's first block is a kind of its own: in a backward nothing before it
needs a gradient, so it does less work than the blocks after it. The tests check the total against every
block run, forward and backward, and the forward against torch's counter on real weights.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from spotlight.models.pipelines.folder import PipelineFolder, read_pipeline_folder
from spotlight.models.pipelines.memory_estimate import lora_input_features
from spotlight.sim.planning.forward_count import ForwardCount, LoraShape, check_transformer_class

__all__ = ["count_built", "count_on_meta", "meta_transformer"]


def meta_transformer(folder: PipelineFolder, lora: LoraShape | None = None) -> nn.Module:
    """The folder's transformer built on the meta device from its config.json (no weights read).

    ``lora``: (rank, target module names) of the adapter to add, as the policy adds it (peft through
    diffusers' ``add_adapter``): its FLOPs are part of every forward. The class is the one model_index.json
    names, as diffusers loads it (transformer/config.json's ``_class_name``, when present, must agree).
    Raises UnknownTransformerError when either names a class other than the family's.
    """
    from spotlight.models.pipelines.folder import component_class

    check_transformer_class(folder)
    cls = component_class(folder, "transformer")
    with torch.device("meta"):
        model = cls.from_config(folder.transformer)
        if lora is not None:
            from peft import LoraConfig

            rank, targets = lora
            model.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=list(targets)))
    return model


def _signature(block: nn.Module) -> tuple[Any, ...]:
    return (type(block).__name__, tuple((name, tuple(p.shape)) for name, p in block.named_parameters()))


def _one_block_of_each_kind(model: nn.Module) -> dict[str, tuple[list[nn.Module], list[int]]]:
    """Every block list's first block of each shape signature, in order, and how many blocks share it.

    The model's very first block is a kind of its own: in a backward its input needs no gradient
    (nothing before it is trained), so it costs less than the later blocks of its shape.
    """
    kinds: dict[str, tuple[list[nn.Module], list[int]]] = {}
    very_first: tuple[Any, ...] | None = None
    for name, child in model.named_children():
        if not isinstance(child, nn.ModuleList) or len(child) < 2:
            continue
        first: dict[tuple[Any, ...], int] = {}
        blocks: list[nn.Module] = []
        counts: list[int] = []
        for block in child:
            signature = _signature(block)
            if very_first is None:
                very_first = signature = ("the first block", signature)
            if signature not in first:
                first[signature] = len(blocks)
                blocks.append(block)
                counts.append(0)
            counts[first[signature]] += 1
        kinds[name] = (blocks, counts)
    return kinds


def _meta_inputs(folder: PipelineFolder, latent_shape: tuple[int, ...], tokens: int, batch: int) -> tuple[Any, ...]:
    from spotlight.models.pipelines.inputs import PromptEmbeddings

    config, meta = folder.transformer, torch.device("meta")
    latents = torch.zeros(batch, *latent_shape, device=meta)  # (C, h, w), or a video's (C, f, h, w)
    pooled = None
    if "pooled_projection_dim" in config:  # SD3, FLUX
        pooled = torch.zeros(batch, int(config["pooled_projection_dim"]), device=meta)
    width = int(config.get("joint_attention_dim") or config["text_dim"])  # Wan names it text_dim
    embeds = torch.zeros(batch, tokens, width, device=meta)
    image = latents if folder.edits else None  # an edit's source latents: as many tokens again
    return latents, torch.full((batch,), 0.5, device=meta), PromptEmbeddings(embeds=embeds, pooled=pooled, image=image)


@functools.lru_cache(maxsize=32)
def count_on_meta(path: Path, resolution: tuple[int, int], tokens: int, batch: int, lora: LoraShape | None,
           backward: bool, every_block: bool, num_frames: int | None = None) -> ForwardCount:
    """`forward_flops.count_forward_flops`'s count, on the meta device (``every_block``: run every block)."""
    folder = read_pipeline_folder(path)
    return count_built(meta_transformer(folder, lora), folder, resolution, tokens, batch, lora, backward, every_block,
                       num_frames)


def count_built(model: nn.Module, folder: PipelineFolder, resolution: tuple[int, int], tokens: int, batch: int,
                lora: LoraShape | None, backward: bool, every_block: bool,
                num_frames: int | None = None) -> ForwardCount:
    """`count_on_meta` of ``model``, ``meta_transformer(folder, lora)``: a caller that also reads the built
    model's parameters builds it once (building Qwen-Image or Wan-14B on the meta device takes a second)."""
    latent_shape = folder.latent_shape(resolution, num_frames)
    named = dict(model.named_parameters())
    parameters = sum(p.numel() for name, p in named.items() if ".lora_" not in name)
    lora_parameters = sum(p.numel() for name, p in named.items() if ".lora_" in name)
    base_shapes = {name.replace(".base_layer", ""): tuple(p.shape) for name, p in named.items() if ".lora_" not in name}
    lora_inputs = lora_input_features(base_shapes, lora[1]) if lora is not None else (0, 0, 0)
    lora_weights = sum(p.numel() for name, p in named.items() if name.endswith(".base_layer.weight") and p.dim() == 2)
    kinds = {} if every_block else _one_block_of_each_kind(model)
    inputs = _meta_inputs(folder, latent_shape, tokens, batch)
    if backward:
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(lora is None or ".lora_" in name)
    flops, train_flops = _counted(model, folder, inputs, kinds, train=backward)
    return ForwardCount(flops=flops, batch=batch, image_tokens=folder.image_tokens(resolution, num_frames),
                        text_tokens=tokens,
                        parameters=parameters, lora_parameters=lora_parameters, train_flops=train_flops,
                        lora_inputs=lora_inputs, lora_weights=lora_weights)


def _counted(model: nn.Module, folder: PipelineFolder, inputs: tuple[Any, ...],
             kinds: dict[str, tuple[list[nn.Module], list[int]]], train: bool) -> tuple[float, float | None]:
    """FLOPs of one forward (and with ``train``, of the forward and its backward: else None) of the whole
    model, from one block of each kind.

    With every block list cut to its kinds, the counted total holds each kind once; running a kind twice
    in a row adds exactly one more block of it (with a gradient flowing into it, as in the full model),
    so the difference is that block's cost, added (count − 1) times. Torch's per-module attribution is
    not used: in a backward it files block work under whichever module's hook fired last.
    """
    originals = {name: getattr(model, name) for name in kinds}
    try:
        for name, (blocks, _) in kinds.items():
            setattr(model, name, nn.ModuleList(blocks))
        base = _total(model, folder, inputs, train)
        total = list(base)
        for name, (blocks, counts) in kinds.items():
            for index, count in enumerate(counts):
                if count > 1:
                    setattr(model, name, nn.ModuleList([*blocks[: index + 1], *blocks[index:]]))
                    more = _total(model, folder, inputs, train)
                    total = [t + (count - 1) * (m - b) for t, m, b in zip(total, more, base, strict=True)]
            setattr(model, name, nn.ModuleList(blocks))
    finally:
        for name, blocks_list in originals.items():
            setattr(model, name, blocks_list)
    return total[0], total[1] if train else None


def _total(model: nn.Module, folder: PipelineFolder, inputs: tuple[Any, ...], train: bool) -> tuple[float, float]:
    """(forward, forward and backward) FLOPs of one call: a backward's forward is the inference forward's ops
    (no dropout, no checkpointing on a built model), so one pass under the counter reads both."""
    from torch.utils.flop_counter import FlopCounterMode

    from spotlight.models.pipelines.inputs import transformer_velocity

    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(train):
        velocity = transformer_velocity(model, folder.family, *inputs)
        forward = float(counter.get_total_flops())
        if train:
            velocity.float().square().mean().backward()
    return forward, float(counter.get_total_flops())
