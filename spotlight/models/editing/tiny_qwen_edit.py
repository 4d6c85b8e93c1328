"""A tiny random Qwen-Image-Edit pipeline: the parts `spotlight.models.pipelines.tiny` saves for ``qwen-image-edit``
(``QwenImageEditPipeline``) and ``qwen-image-edit-plus`` (``QwenImageEditPlusPipeline``, Edit-2509: the same parts).

Qwen-Image's tiny transformer, VAE and scheduler, with a text encoder that sees images: a Qwen2.5-VL whose
vision tower (one block, 2-pixel patches, no merging) feeds the language model through the processor's
``<|image_pad|>`` tokens, as ``QwenImageEditPipeline.encode_prompt`` shows it the source image. The
character-level tokenizer gets Qwen's three vision tokens as special tokens (the chat template names
them; each must be one id), and the model config those ids. The image processor caps the picture the
encoder sees at 16 x 16 pixels (``max_pixels``): 64 vision tokens, a few milliseconds on a CPU.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VISION_TOKENS", "edit_text_encoder", "edit_tokenizer", "tiny_qwen_edit_parts"]

VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
MAX_PIXELS = 16 * 16  # what the processor shrinks a source image to, at most, for the text encoder


def edit_tokenizer(base: Any) -> Any:
    """``base`` (a character-level fast tokenizer) with Qwen's vision tokens as single special tokens."""
    base.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    return base


def edit_text_encoder(tokenizer: Any, width: int) -> Any:
    """A random Qwen2.5-VL ``width`` wide over ``tokenizer``'s ids, its vision token ids set from it."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    start, image, end, video = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=width, intermediate_size=2 * width,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=2048,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                         pad_token_id=0, bos_token_id=2, eos_token_id=3),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=width,
                           patch_size=2, spatial_merge_size=1, temporal_patch_size=1, fullatt_block_indexes=[0]),
        image_token_id=image, video_token_id=video, vision_start_token_id=start, vision_end_token_id=end,
        pad_token_id=0, bos_token_id=2, eos_token_id=3)
    return Qwen2_5_VLForConditionalGeneration(config)


def tiny_qwen_edit_parts(parts: dict[str, Any]) -> dict[str, Any]:
    """The components of a tiny ``QwenImageEditPipeline`` from a tiny ``QwenImagePipeline``'s ``parts``: its
    transformer, VAE and scheduler, an image-seeing text encoder (random weights from torch's current RNG),
    the tokenizer with vision tokens and the processor over both."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from spotlight.models.editing.qwen_processor import edit_processor

    tokenizer = edit_tokenizer(parts["tokenizer"])
    width = int(parts["transformer"].config.joint_attention_dim)
    images = Qwen2VLImageProcessorPil(patch_size=2, merge_size=1, temporal_patch_size=1, min_pixels=4 * 4,
                                      max_pixels=MAX_PIXELS)
    return {**parts, "tokenizer": tokenizer, "text_encoder": edit_text_encoder(tokenizer, width),
            "processor": edit_processor(images, tokenizer)}
