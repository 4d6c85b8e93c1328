"""Tiny, randomly initialised diffusers pipeline folders (SD3, FLUX, Qwen-Image, Wan2.1, and the edit pipelines
FLUX.1 Kontext and Qwen-Image-Edit) built with no model hub.

What a test, a benchmark or a user on a laptop points ``model.pretrained`` at when no real checkpoint
is at hand: every part is the family's real class (``SD3Transformer2DModel``, ``AutoencoderKL``,
CLIP / T5 / Qwen2.5-VL text encoders, ...), only a few layers wide, saved with the pipeline's own
``save_pretrained``. So the folder goes through exactly the loading, prompt encoding, latent geometry,
schedule and VAE decoding code a 20 B checkpoint goes through; only the sizes differ.

The tokenizers are character-level ``PreTrainedTokenizerFast`` objects made in-process (no vocabulary
download): any prompt encodes, and two prompts that differ in one character get different embeddings.
(Qwen-Image's pipeline drops the first 34 tokens of its chat template, which a word-level tokenizer
would exhaust.) The VAEs have two resolution levels, so the VAE scale factor is 2 (Qwen-Image's: 2
as well, one temporal-downsample flag), and 32-pixel images have 16 x 16 latents.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import torch

from spotlight.models.pipelines.family_config import Family

__all__ = ["FAMILIES", "TINY_PIPELINES", "build_tiny_pipeline", "character_tokenizer", "clip_text_encoder",
           "qwen_vl_text_encoder", "save_tiny_pipeline", "t5_encoder"]

FAMILIES: tuple[Family, ...] = ("sd3", "flux", "qwen-image", "wan")
CLIP_MAX_LENGTH = 77  # CLIP's position table; the SD3 / FLUX pipelines pad CLIP prompts to the tokenizer's max
_SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>")


def character_tokenizer(model_max_length: int, with_bos: bool) -> Any:
    """A character-level fast tokenizer over printable ASCII: pad 0, unk 1, bos 2, eos 3.

    ``with_bos``: wrap every text in <bos> ... <eos> as CLIP does (T5 appends only <eos>; Qwen's chat
    template brings its own markers, so it gets neither).
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocabulary = {token: index for index, token in enumerate(_SPECIALS)}
    for character in string.printable:
        vocabulary.setdefault(character, len(vocabulary))
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    if with_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<bos> $A <eos>", special_tokens=[("<bos>", 2), ("<eos>", 3)])
    else:
        tokenizer.post_processor = processors.TemplateProcessing(single="$A <eos>", special_tokens=[("<eos>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=model_max_length, pad_token="<pad>",
                                   unk_token="<unk>", bos_token="<bos>", eos_token="<eos>")


def _vocab_size() -> int:
    return len(set(_SPECIALS) | set(string.printable))


def clip_text_encoder(hidden: int, projection: int | None, layers: int = 2) -> Any:
    """A random CLIP text encoder over the character vocabulary: ``hidden`` wide, ``layers`` deep, two heads.

    ``projection`` None: a plain ``CLIPTextModel`` (FLUX reads its pooled output); else one with a text
    projection of that width (SD3 concatenates two). The width is what a pipeline's embeddings take their
    shape from, so a benchmark keeps a published width at 1-2 layers.
    """
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=layers, num_attention_heads=2, max_position_embeddings=CLIP_MAX_LENGTH,
                            projection_dim=projection or hidden, pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return CLIPTextModelWithProjection(config) if projection is not None else CLIPTextModel(config)


def t5_encoder(width: int, layers: int = 2) -> Any:
    """A random T5 encoder over the character vocabulary: ``width`` wide (the embeddings' width), ``layers`` deep."""
    from transformers import T5Config, T5EncoderModel

    config = T5Config(vocab_size=_vocab_size(), d_model=width, d_kv=8, d_ff=2 * width, num_layers=layers, num_heads=2,
                      relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=3, decoder_start_token_id=0)
    return T5EncoderModel(config)


def _autoencoder_kl(latent_channels: int, scaling_factor: float, shift_factor: float | None) -> Any:
    from diffusers import AutoencoderKL

    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=latent_channels,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4,
                         scaling_factor=scaling_factor, shift_factor=shift_factor, sample_size=32)


def _sd3() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    transformer = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=16, pooled_projection_dim=32,
        pos_embed_max_size=32, qk_norm="rms_norm", dual_attention_layers=(0,))
    return dict(
        transformer=transformer, vae=_autoencoder_kl(4, 1.5305, 0.0609),
        text_encoder=clip_text_encoder(8, 16), text_encoder_2=clip_text_encoder(8, 16),
        text_encoder_3=t5_encoder(32),
        tokenizer=character_tokenizer(CLIP_MAX_LENGTH, True), tokenizer_2=character_tokenizer(CLIP_MAX_LENGTH, True),
        tokenizer_3=character_tokenizer(256, False),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def _flux() -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=16, guidance_embeds=True, axes_dims_rope=(4, 4, 8))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=16, max_image_seq_len=256)
    return dict(
        transformer=transformer, vae=_autoencoder_kl(4, 0.3611, 0.1159),
        text_encoder=clip_text_encoder(16, None), text_encoder_2=t5_encoder(32),
        tokenizer=character_tokenizer(CLIP_MAX_LENGTH, True), tokenizer_2=character_tokenizer(512, False),
        scheduler=scheduler)


def qwen_vl_text_encoder(width: int, heads: int = 2, kv_heads: int = 2, intermediate: int = 64,
                         mrope_section: tuple[int, ...] | list[int] = (2, 3, 3), layers: int = 2) -> Any:
    """A random Qwen2.5-VL over the character vocabulary: its language model ``width`` wide with ``heads``
    (``kv_heads`` key-value) heads and ``layers`` layers, and a one-block vision tower the prompts never use.

    ``mrope_section`` must sum to half the head width (``width / heads / 2``), as Qwen2.5-VL's rotary
    sections do.
    """
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=_vocab_size(), hidden_size=width, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=1024,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": list(mrope_section)},
                         pad_token_id=0, bos_token_id=2, eos_token_id=3),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=width,
                           patch_size=2, spatial_merge_size=1, temporal_patch_size=1, fullatt_block_indexes=[0]),
        pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return Qwen2_5_VLForConditionalGeneration(config)


def _qwen_image() -> dict[str, Any]:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    text_width = 32
    z_dim = 4
    generator = torch.Generator().manual_seed(0)
    latents_mean = (torch.randn(z_dim, generator=generator) * 0.5).tolist()
    latents_std = (1.0 + torch.rand(z_dim, generator=generator)).tolist()
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=z_dim, dim_mult=[1, 2], num_res_blocks=1,
                                 temperal_downsample=[False], latents_mean=latents_mean, latents_std=latents_std)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * z_dim, out_channels=z_dim, num_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=text_width, axes_dims_rope=(8, 4, 4))
    scheduler = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                base_image_seq_len=16, max_image_seq_len=256,
                                                time_shift_type="exponential")
    return dict(transformer=transformer, vae=vae, text_encoder=qwen_vl_text_encoder(text_width),
                tokenizer=character_tokenizer(2048, False), scheduler=scheduler)


def _qwen_image_edit() -> dict[str, Any]:
    from spotlight.models.editing.tiny_qwen_edit import tiny_qwen_edit_parts

    return tiny_qwen_edit_parts(_qwen_image())


def _wan() -> dict[str, Any]:
    from spotlight.models.video.tiny_wan import tiny_wan_parts

    return tiny_wan_parts(character_tokenizer(512, False), _vocab_size())


def _wan22() -> dict[str, Any]:
    from spotlight.models.video.tiny_wan import tiny_wan22_parts

    return tiny_wan22_parts(character_tokenizer(512, False), _vocab_size())


_PARTS = {"sd3": (_sd3, "StableDiffusion3Pipeline"), "flux": (_flux, "FluxPipeline"),
          "qwen-image": (_qwen_image, "QwenImagePipeline"), "wan": (_wan, "WanPipeline"),
          "flux-kontext": (_flux, "FluxKontextPipeline"),  # Kontext: FLUX's parts, saved as the edit pipeline
          "qwen-image-edit": (_qwen_image_edit, "QwenImageEditPipeline"),  # + an image-seeing text encoder
          "qwen-image-edit-plus": (_qwen_image_edit, "QwenImageEditPlusPipeline"),
          "wan22": (_wan22, "WanPipeline")}  # Wan2.2 A14B: two experts and boundary_ratio
# what make-tiny-pipeline builds: the families, the edit pipelines and Wan2.2's two experts by their own names
TINY_PIPELINES: tuple[str, ...] = (*FAMILIES, "flux-kontext", "qwen-image-edit", "qwen-image-edit-plus", "wan22")


def build_tiny_pipeline(family: Family | str, seed: int = 0) -> Any:
    """A tiny random pipeline of ``family`` (the diffusers pipeline object), every weight drawn from ``seed``.

    The caller's random stream is left as it was (a forked RNG).
    """
    import diffusers

    if family not in _PARTS:
        raise ValueError(f"unknown family {family!r}: use one of {list(_PARTS)}")
    make_parts, pipeline_class = _PARTS[family]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        parts = make_parts()
    for part in parts.values():
        if isinstance(part, torch.nn.Module):
            part.eval()
    return getattr(diffusers, pipeline_class)(**parts)


def save_tiny_pipeline(family: Family | str, folder: str | Path, seed: int = 0) -> Path:
    """Build a tiny ``family`` pipeline and ``save_pretrained`` it into ``folder`` (created); returns the folder."""
    from spotlight.models.pipelines.folder import component_class, read_pipeline_folder

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pipe = build_tiny_pipeline(family, seed)
    pipe.save_pretrained(str(folder))
    if "processor" in pipe.components:  # Qwen-Image-Edit's, built without torchvision: named as transformers'
        from spotlight.models.editing.qwen_processor import portable_folder

        portable_folder(folder)
    saved = read_pipeline_folder(folder)
    for part in saved.components:  # every class model_index.json names is one diffusers (and Spotlight) can load
        component_class(saved, part)
    return folder
