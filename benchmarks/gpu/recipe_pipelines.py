"""Random-weight pipeline folders whose text encoders have their published depths, heads and MLPs too.

`published_pipelines.py` builds the transformer, the VAE and the scheduler from the published configs
but keeps 1-2 text-encoder layers. A recipe's iteration encodes its prompts (every iteration draws new
ones from the recipe's prompt set, and the cache only helps once a prompt repeats), so what encoding
costs a user is measured only with the real encoders: CLIP ViT-L/14's text model (12 layers), OpenCLIP
ViT-bigG/14's (32), T5 v1.1 XXL's encoder (24 layers, 64 heads, gated-GELU MLP of 10240; 4.7 B) and
Qwen2.5-VL-7B's language model (28 layers, grouped-query attention). Weights are random and the
tokenizers character-level (`spotlight.models.pipelines.tiny`), so a prompt has about as many tokens as
characters: the released tokenizers' sequence lengths for SD3 (padded to fixed lengths), and for
Qwen-Image the prompt's characters plus the template's words (`published_pipelines._add_template_words`).

``small=True`` keeps the published depths but `published_pipelines.SMALL`'s tiny widths and two heads,
so the same path runs on a CPU in seconds. Nothing is downloaded.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: `benchmarks.*` imports

from benchmarks.gpu.published_pipelines import build_pipeline, load_published

__all__ = ["ARCHITECTURES", "describe", "save_recipe_pipeline"]

# per encoder kind: the published architecture (widths come from model_configs/<model>/text_encoders.json)
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "clip-l": {"layers": 12, "heads": 12, "mlp": 3072, "act": "quick_gelu"},  # CLIP ViT-L/14 text model
    "clip-g": {"layers": 32, "heads": 20, "mlp": 5120, "act": "gelu"},  # OpenCLIP ViT-bigG/14 text model
    "t5": {"layers": 24, "heads": 64, "d_kv": 64, "mlp": 10240, "buckets": 32},  # T5 v1.1 XXL encoder
    "qwen2.5-vl": {"layers": 28},  # Qwen2.5-VL-7B's language model (heads, MLP in text_encoders.json)
}


def _kind(spec: dict[str, Any]) -> str:
    if spec["kind"] == "clip":
        return "clip-g" if int(spec["hidden"]) >= 1024 else "clip-l"
    return spec["kind"]


def _published_width(model: str, name: str) -> int:
    return int(load_published(model)["text_encoders"][name]["hidden"])


def text_encoder(model: str, name: str, spec: dict[str, Any], vocab: int, small: bool) -> Any:
    """``name``'s encoder of ``model`` at its published depth (and, unless ``small``, heads and MLP width)."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel

    kind = _kind({**spec, "hidden": _published_width(model, name)})  # the published width names the encoder
    arch, hidden = ARCHITECTURES[kind], int(spec["hidden"])
    if kind.startswith("clip"):
        config = CLIPTextConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=arch["layers"],
                                num_attention_heads=2 if small else arch["heads"],
                                intermediate_size=2 * hidden if small else arch["mlp"], hidden_act=arch["act"],
                                max_position_embeddings=77, projection_dim=spec.get("projection") or hidden,
                                pad_token_id=0, bos_token_id=2, eos_token_id=3)
        return CLIPTextModelWithProjection(config) if spec.get("projection") else CLIPTextModel(config)
    if kind == "t5":
        config = T5Config(vocab_size=vocab, d_model=hidden, d_kv=8 if small else arch["d_kv"],
                          d_ff=2 * hidden if small else arch["mlp"], num_layers=arch["layers"],
                          num_heads=2 if small else arch["heads"], feed_forward_proj="gated-gelu",
                          relative_attention_num_buckets=8 if small else arch["buckets"], pad_token_id=0,
                          eos_token_id=3, decoder_start_token_id=0)
        return T5EncoderModel(config)
    from spotlight.models.pipelines.tiny import qwen_vl_text_encoder

    encoder = qwen_vl_text_encoder(hidden, heads=int(spec["heads"]), kv_heads=int(spec["kv_heads"]),
                                   intermediate=int(spec["intermediate"]), mrope_section=list(spec["mrope_section"]),
                                   layers=arch["layers"])
    encoder.resize_token_embeddings(vocab, mean_resizing=False)
    return encoder


def describe(model: str, small: bool) -> str:
    """One line: each text encoder's kind, width, depth and heads as built."""
    parts = []
    for name, spec in load_published(model, small)["text_encoders"].items():
        kind = _kind({**spec, "hidden": _published_width(model, name)})
        arch = ARCHITECTURES[kind]
        heads = 2 if small else arch.get("heads", spec.get("heads"))
        parts.append(f"{name} {kind} width {spec['hidden']} x {arch['layers']} layers, {heads} heads")
    return (f"text encoders at published depth{' (small widths)' if small else ''}: " + ", ".join(parts)
            + "; random weights, character-level tokenizers")


def save_recipe_pipeline(model: str, folder: Path, small: bool, device: str, dtype: torch.dtype) -> tuple[Path, bool]:
    """``folder`` holding ``model``'s random pipeline with published-depth text encoders (built now, or kept from
    an earlier run of the same configs); returns (folder, whether it was built now)."""
    stamp = {"model": model, "small": small, "dtype": str(dtype), "configs": load_published(model, small),
             "text_encoders": describe(model, small)}
    marker = folder / "benchmark_configs.json"
    if marker.is_file() and json.loads(marker.read_text()) == json.loads(json.dumps(stamp)):
        return folder, False
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    pipeline = build_pipeline(model, small, device, dtype)
    specs = load_published(model, small)["text_encoders"]
    default_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(1)
        torch.set_default_dtype(dtype)  # a 4.7 B T5 or a 7 B Qwen2.5-VL built in float32 would double its memory
        try:
            for name, spec in specs.items():
                tokenizer = getattr(pipeline, name.replace("text_encoder", "tokenizer"))
                setattr(pipeline, name, None)  # the 1-2 layer encoder's memory back before the deep one is built
                encoder = text_encoder(model, name, spec, len(tokenizer), small).to(dtype).eval().requires_grad_(False)
                pipeline.register_modules(**{name: encoder})
        finally:
            torch.set_default_dtype(default_dtype)
    pipeline.save_pretrained(str(folder))
    del pipeline
    marker.write_text(json.dumps(stamp, indent=1) + "\n")
    return folder, True


