"""Tiny randomly initialised reward models saved the way real ones are (save_pretrained), for plumbing tests.

Their scores mean nothing: they prove that a folder is found, checked, loaded and run end to end at
the image sizes of real pipelines. Real checkpoints are named in docs/rewards.md.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spotlight.rewards.geneval.detection import GENEVAL_NAMES

# a few COCO classes in the checkpoint's spelling ("mouse" becomes GenEval's "computer mouse")
TINY_DETECTOR_LABELS = ("person", "bench", "pizza", "clock", "mouse", "couch", "bird", "sink")
assert "mouse" in GENEVAL_NAMES


def save_tiny_clip(folder: Path, seed: int = 0, image_size: int = 32) -> Path:
    """A 2-layer CLIPModel (32-px images) with a word-level tokenizer and a CLIP processor, in `folder`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTextConfig,
        CLIPVisionConfig,
        PreTrainedTokenizerFast,
    )

    words = ["<pad>", "<unk>", "<s>", "</s>", *sorted({w for w in (
        "a photo of depicts the sign that says hello world red orange yellow green blue purple pink brown black "
        "white object colored -colored clock bench pizza couch bird sink person computer mouse cat dog").split()})]
    vocab = {word: index for index, word in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=77, pad_token="<pad>",
                                        unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    torch.manual_seed(seed)
    config = CLIPConfig(
        text_config=CLIPTextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, max_position_embeddings=77, pad_token_id=0,
                                   bos_token_id=2, eos_token_id=3).to_dict(),
        vision_config=CLIPVisionConfig(image_size=image_size, patch_size=8, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=2, num_attention_heads=2).to_dict(),
        projection_dim=16)
    CLIPModel(config).save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                         crop_size={"height": image_size, "width": image_size})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


def save_tiny_mask2former(folder: Path, seed: int = 0) -> Path:
    """A Mask2Former (1-block Swin, 2 decoder layers, 8 queries) over TINY_DETECTOR_LABELS, with its processor."""
    from transformers import (
        Mask2FormerConfig,
        Mask2FormerForUniversalSegmentation,
        Mask2FormerImageProcessor,
        SwinConfig,
    )

    torch.manual_seed(seed)
    backbone = SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
                          window_size=4, out_features=["stage1", "stage2", "stage3", "stage4"])
    labels = dict(enumerate(TINY_DETECTOR_LABELS))
    config = Mask2FormerConfig(backbone_config=backbone, feature_size=32, mask_feature_size=32, hidden_dim=32,
                               encoder_feedforward_dim=64, dim_feedforward=64, encoder_layers=1, decoder_layers=2,
                               num_attention_heads=2, num_queries=8, num_labels=len(labels), id2label=labels,
                               label2id={v: k for k, v in labels.items()}, common_stride=4, train_num_points=64)
    Mask2FormerForUniversalSegmentation(config).save_pretrained(folder)
    Mask2FormerImageProcessor(size={"height": 64, "width": 64}, do_resize=True).save_pretrained(folder)
    return folder
