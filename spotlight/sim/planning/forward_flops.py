"""FLOPs of one transformer forward of a pipeline folder, counted from its transformer/config.json.

`spotlight plan` prices a run before anything is rented, so it cannot load 40 GB of weights, and a
hand-written formula (24·L·d²·n + 4·L·n²·d) misses what each family adds: SD3.5's second attention
in its first 13 blocks, FLUX's single-stream blocks, every adaLN modulation. So each family's forward is
walked Linear by Linear from the config's numbers (`spotlight.sim.planning.analytic`): the FLOPs torch's
``FlopCounterMode`` would count for a forward (and a backward) of the built model, its parameters and its
LoRA adapters, exactly, with no diffusers, peft or model built, in milliseconds. The reference is the
meta-device count (`spotlight.sim.planning.meta_flops`: the class built under ``torch.device("meta")``
and run under the counter), which the tests hold every shipped family config to, and which counts any
config the walks do not model (``reference=True`` asks for it; it is kept on disk,
`spotlight.sim.planning.count_cache`, since it imports diffusers and peft: seconds).

Shapes, as the family's pipeline makes them:
- image tokens: (H / (vae · 2)) · (W / (vae · 2)) (`PipelineFolder.latent_size`, 2x2 patches);
- text tokens (`text_tokens`): SD3 concatenates CLIP's 77 padded tokens with T5's ``max_sequence_length``
  (256): 333; FLUX pads T5 to ``max_sequence_length`` (512); Qwen-Image drops its chat template's 34
  prefix tokens and pads no further than the longest prompt, so its count is the prompt's own
  (``prompt_tokens``: an assumption the caller states).
"""

from __future__ import annotations

from dataclasses import asdict

from spotlight.models.pipelines.folder import PipelineFolder
from spotlight.models.pipelines.memory_estimate import CLIP_TOKENS
from spotlight.models.pipelines.prompts import DEFAULT_MAX_SEQUENCE_LENGTH
from spotlight.sim.planning.analytic.trace import NotAnalytic
from spotlight.sim.planning.analytic.transformer_count import count_transformer
from spotlight.sim.planning.count_cache import cached
from spotlight.sim.planning.forward_count import (
    ForwardCount,
    LoraShape,
    UnknownTransformerError,
    check_transformer_class,
)

__all__ = ["ForwardCount", "UnknownTransformerError", "count_forward_flops", "text_tokens"]

# Qwen-Image's chat template adds "<|im_end|>\n<|im_start|>assistant\n" (5 tokens) after the prompt
# once the 34 prefix tokens are dropped (diffusers' QwenImagePipeline._get_qwen_prompt_embeds)
QWEN_TEMPLATE_SUFFIX_TOKENS = 5


def text_tokens(folder: PipelineFolder, max_sequence_length: int | None, prompt_tokens: int) -> int:
    """Text tokens the transformer sees per sample (module docstring), as the family's pipeline pads them."""
    length = max_sequence_length or DEFAULT_MAX_SEQUENCE_LENGTH[folder.family]
    if folder.family == "sd3":
        return CLIP_TOKENS + length
    if folder.family in ("flux", "wan"):  # T5 / UMT5 padded to the full length
        return length
    return min(prompt_tokens + QWEN_TEMPLATE_SUFFIX_TOKENS, length)


def count_forward_flops(folder: PipelineFolder, resolution: tuple[int, int], tokens: int, batch: int = 1,
                        lora: LoraShape | None = None, backward: bool = False,
                        every_block: bool = False, num_frames: int | None = None,
                        reference: bool = False) -> ForwardCount:
    """Count one forward of ``batch`` samples at ``resolution`` (pixels, (H, W)) with ``tokens`` text tokens.

    ``lora``: (rank, target modules) of a LoRA adapter to count with the base (None: full fine-tuning
    or no adapter). ``backward``: also count a forward and backward (``ForwardCount.train_flops``).
    ``num_frames``: a video family's frames per sample (None: its pipeline's default). ``reference``:
    count on the meta device (module docstring; kept on disk by config and arguments); ``every_block``:
    on the meta device, running every block instead of one of each kind (slow; what its test compares).
    Raises PipelineFolderError (one line) for a resolution the folder cannot take and
    UnknownTransformerError for a transformer class Spotlight does not know.
    """
    lora = None if lora is None else (int(lora[0]), tuple(lora[1]))
    size = (int(resolution[0]), int(resolution[1]))
    if every_block:
        from spotlight.sim.planning.meta_flops import count_on_meta

        return count_on_meta(folder.path, size, tokens, batch, lora, backward, every_block, num_frames)
    folder.latent_shape(size, num_frames)  # a resolution (or frame count) the model cannot take fails here
    check_transformer_class(folder)
    image_tokens = folder.image_tokens(size, num_frames)
    if not reference:
        try:
            counted = count_transformer(folder.family, folder.transformer, image_tokens, tokens, batch, lora)
        except NotAnalytic:
            pass  # a config the walks do not model: the meta device counts it
        else:
            return ForwardCount(flops=counted.flops, batch=batch, image_tokens=image_tokens, text_tokens=tokens,
                                parameters=counted.parameters, lora_parameters=counted.lora_parameters,
                                train_flops=counted.train_flops if backward else None,
                                lora_inputs=counted.lora_inputs, lora_weights=counted.lora_weights)
    return _on_meta(folder, size, tokens, batch, lora, backward, num_frames)


def _on_meta(folder: PipelineFolder, size: tuple[int, int], tokens: int, batch: int, lora: LoraShape | None,
             backward: bool, num_frames: int | None) -> ForwardCount:
    """The meta-device count, from the count cache when it holds it."""
    from spotlight.sim.planning.meta_flops import count_on_meta

    key = {"transformer": folder.transformer, "family": folder.family, "resolution": size, "tokens": tokens,
           "batch": batch, "lora": lora, "backward": backward}
    if folder.edits:
        key["edits"] = True
    if folder.is_video:
        key["num_frames"] = num_frames
    counted = cached("forward", key, lambda: asdict(
        count_on_meta(folder.path, size, tokens, batch, lora, backward, False, num_frames)))
    return ForwardCount(**{**counted, "lora_inputs": tuple(counted["lora_inputs"])})
