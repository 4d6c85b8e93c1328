"""Random-weight diffusers pipeline folders with the published architectures of SD3.5-Medium, FLUX.1-dev and Qwen-Image.

What `gpu_throughput.py` measures on: every part is the family's own diffusers / transformers class, so
a forward costs what the released model's forward costs, and the folder loads through the same code as
the released checkpoint. Nothing is downloaded:

- the transformer, the VAE and the scheduler come from the published config.json files, shipped as
  small JSON in ``benchmarks/model_configs/<model>/`` (keys starting with ``_`` are notes: the source,
  and which values are recalled rather than checked);
- the text encoders keep the published widths (so the prompt embeddings have the released shapes) but
  have 1-2 layers with random weights: text encoding is a small share of a step's cost and is cached by
  Spotlight, and a 4.7 B T5 would only add set-up time. ``text_encoders.json`` records the published
  depths beside what is built;
- the tokenizers are the character-level ones `spotlight.models.pipelines.tiny` makes in-process. SD3's
  and FLUX's text is padded to a fixed length, so their token counts are the released ones. Qwen-Image's
  is not: its pipeline wraps the prompt in a chat template and drops the template's first 34 tokens, so
  character by character about 180 template characters would survive the crop (211 text tokens for a
  31-character prompt, 20% more tokens per forward than the released model). So the template's words
  become tokens of their own (`_add_template_words`): the crop then removes exactly the template's
  prefix, as the released tokenizer does, and a prompt costs its own characters plus 5 tokens.

``small=True`` shrinks every width and depth (``SMALL``) so that the same code runs on a CPU in seconds:
what the test suite checks.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from spotlight.models.pipelines.tiny import (
    CLIP_MAX_LENGTH,
    character_tokenizer,
    clip_text_encoder,
    qwen_vl_text_encoder,
    t5_encoder,
)

__all__ = ["MODELS", "SMALL", "describe_text_encoders", "load_published", "save_pipeline"]

CONFIGS = Path(__file__).resolve().parents[1] / "model_configs"
MODELS: dict[str, dict[str, str]] = {  # benchmark name -> Spotlight family and diffusers pipeline class
    "sd35m": {"family": "sd3", "pipeline": "StableDiffusion3Pipeline", "title": "SD3.5-Medium"},
    "flux": {"family": "flux", "pipeline": "FluxPipeline", "title": "FLUX.1-dev"},
    "qwen-image": {"family": "qwen-image", "pipeline": "QwenImagePipeline", "title": "Qwen-Image"},
}
TEXT_LAYERS = {"clip": 2, "t5": 2, "qwen2.5-vl": 1}  # layers built per text encoder kind (widths are published)
_SMALL_VAE_KL = {"block_out_channels": [8, 16], "layers_per_block": 1, "norm_num_groups": 4, "sample_size": 32,
                 "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2}
SMALL: dict[str, dict[str, dict[str, Any]]] = {  # overrides of the published configs for the CPU's small mode
    "sd35m": {
        "transformer": {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 8, "joint_attention_dim": 32,
                        "caption_projection_dim": 16, "pooled_projection_dim": 32, "dual_attention_layers": [0],
                        "pos_embed_max_size": 32, "sample_size": 16},
        "vae": _SMALL_VAE_KL,
        "text_encoder": {"hidden": 8, "projection": 16}, "text_encoder_2": {"hidden": 8, "projection": 16},
        "text_encoder_3": {"hidden": 32},
    },
    "flux": {
        "transformer": {"num_layers": 1, "num_single_layers": 1, "num_attention_heads": 2, "attention_head_dim": 16,
                        "joint_attention_dim": 32, "pooled_projection_dim": 16, "axes_dims_rope": [4, 4, 8]},
        "vae": _SMALL_VAE_KL,
        "text_encoder": {"hidden": 16}, "text_encoder_2": {"hidden": 32},
    },
    "qwen-image": {
        "transformer": {"num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16, "joint_attention_dim": 32,
                        "axes_dims_rope": [8, 4, 4]},
        "vae": {"base_dim": 8, "dim_mult": [1, 2], "num_res_blocks": 1, "temperal_downsample": [False]},
        "text_encoder": {"hidden": 32, "heads": 2, "kv_heads": 2, "intermediate": 64, "mrope_section": [2, 3, 3]},
    },
}


def _read(path: Path) -> dict[str, Any]:
    return {key: value for key, value in json.loads(path.read_text()).items() if not key.startswith("_")}


def _class_name(model: str, part: str) -> str:
    return json.loads((CONFIGS / model / f"{part}.json").read_text())["_class_name"]


def load_published(model: str, small: bool = False) -> dict[str, dict[str, Any]]:
    """The shipped configs of ``model`` (transformer, vae, scheduler, text_encoders), notes stripped; ``small``
    applies `SMALL`'s overrides. ValueError naming the models there are for an unknown one."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: use one of {sorted(MODELS)}")
    folder = CONFIGS / model
    parts = {part: _read(folder / f"{part}.json") for part in ("transformer", "vae", "scheduler", "text_encoders")}
    if small:
        overrides = SMALL[model]
        parts["transformer"].update(overrides["transformer"])
        parts["vae"].update(overrides["vae"])
        for name, spec in parts["text_encoders"].items():
            spec.update(overrides.get(name, {}))
    return parts


def _text_encoder(spec: dict[str, Any]) -> tuple[Any, Any]:
    """(model, tokenizer) of one text encoder spec: the published width, `TEXT_LAYERS` layers, random weights."""
    kind, hidden = spec["kind"], int(spec["hidden"])
    layers = TEXT_LAYERS[kind]
    if kind == "clip":
        return (clip_text_encoder(hidden, spec.get("projection"), layers=layers),
                character_tokenizer(CLIP_MAX_LENGTH, True))
    if kind == "t5":
        return t5_encoder(hidden, layers=layers), character_tokenizer(int(spec["max_length"]), False)
    return (qwen_vl_text_encoder(hidden, heads=int(spec["heads"]), kv_heads=int(spec["kv_heads"]),
                                 intermediate=int(spec["intermediate"]), mrope_section=list(spec["mrope_section"]),
                                 layers=layers),
            character_tokenizer(int(spec.get("max_length", 2048)), False))


def describe_text_encoders(model: str, small: bool = False) -> str:
    """One line: each text encoder's kind, width and the layers built (what the output must say)."""
    specs = load_published(model, small)["text_encoders"]
    shown = ", ".join(f"{name} {spec['kind']} width {spec['hidden']} x {TEXT_LAYERS[spec['kind']]} layer(s)"
                      for name, spec in specs.items())
    return f"text encoders: {shown}; random weights, character-level tokenizers"


def build_pipeline(model: str, small: bool, device: str, dtype: torch.dtype, seed: int = 0) -> Any:
    """The diffusers pipeline object of ``model`` with random weights, built on ``device`` in ``dtype``.

    Built on the device (a 20 B transformer initialises in seconds on a GPU, minutes on a CPU) from a
    seeded generator; the caller's random stream is left as it was.
    """
    import diffusers

    parts_config = load_published(model, small)
    spec = MODELS[model]
    transformer_class, vae_class = (getattr(diffusers, _class_name(model, part)) for part in ("transformer", "vae"))
    default_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)  # built in the run's dtype: a 20 B float32 transformer is 82 GB
        try:
            pipeline = getattr(diffusers, spec["pipeline"])(**_parts(parts_config, transformer_class, vae_class, dtype))
            if spec["family"] == "qwen-image":
                _add_template_words(pipeline)
        finally:
            torch.set_default_dtype(default_dtype)
    for part in pipeline.components.values():
        if isinstance(part, torch.nn.Module):
            part.eval().requires_grad_(False)
    return pipeline


TEMPLATE_WORDS = re.compile(r"<\|im_(?:start|end)\|>| ?\w+")  # Qwen's chat markers and (space-led) words


def _add_template_words(pipeline: Any) -> None:
    """Make each word and chat marker of a Qwen-Image pipeline's prompt template one token of its tokenizer.

    Split that way (markers, words with their leading space, one token per other character, as Qwen's BPE
    splits this text) the template's prefix is exactly the ``prompt_template_encode_start_idx`` tokens the
    pipeline drops; a ValueError says so if a diffusers version changed the template. The text encoder's
    embedding table grows by the new tokens (random rows, drawn in `build_pipeline`'s seeded context).
    """
    template, start = pipeline.prompt_template_encode, pipeline.prompt_template_encode_start_idx
    pipeline.tokenizer.add_tokens(sorted(set(TEMPLATE_WORDS.findall(template.replace("{}", "")))))
    pipeline.text_encoder.resize_token_embeddings(len(pipeline.tokenizer), mean_resizing=False)
    prefix = template.split("{}")[0]
    count = len(pipeline.tokenizer(prefix, add_special_tokens=False)["input_ids"])
    if count != start:
        raise ValueError(f"Qwen-Image's template prefix tokenizes to {count} tokens, not the {start} its pipeline "
                         "drops: update published_pipelines.TEMPLATE_WORDS for this diffusers version")


def _parts(parts_config: dict[str, dict[str, Any]], transformer_class: type, vae_class: type,
           dtype: torch.dtype) -> dict[str, Any]:
    """The pipeline's components from the configs (`build_pipeline` sets the device, dtype and seed around it)."""
    import diffusers

    parts: dict[str, Any] = {
        "transformer": transformer_class(**parts_config["transformer"]).to(dtype),
        "vae": vae_class(**parts_config["vae"]).to(dtype),
        "scheduler": diffusers.FlowMatchEulerDiscreteScheduler(**parts_config["scheduler"]),
    }
    for name, text_spec in parts_config["text_encoders"].items():
        encoder, tokenizer = _text_encoder(text_spec)
        parts[name] = encoder.to(dtype)
        parts[name.replace("text_encoder", "tokenizer")] = tokenizer
    return parts


def save_pipeline(model: str, folder: Path, small: bool, device: str, dtype: torch.dtype) -> tuple[Path, bool]:
    """``folder`` holding the random ``model`` pipeline (built and saved now, or kept from an earlier run of the
    same configs); returns (folder, whether it was built now). A folder whose recorded configs differ is rebuilt."""
    stamp = {"model": model, "small": small, "dtype": str(dtype), "configs": load_published(model, small)}
    marker = folder / "benchmark_configs.json"
    if marker.is_file() and json.loads(marker.read_text()) == json.loads(json.dumps(stamp)):
        return folder, False
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    pipeline = build_pipeline(model, small, device, dtype)
    pipeline.save_pretrained(str(folder))
    del pipeline
    marker.write_text(json.dumps(stamp, indent=1) + "\n")
    return folder, True
