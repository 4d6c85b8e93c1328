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


def save_tiny_aesthetic_predictor(file: Path, embed_dim: int, seed: int = 0) -> Path:
    """The LAION aesthetic predictor's state dict (its release's keys and hidden widths) over `embed_dim`-d
    embeddings, random, saved with torch.save as `sac+logos+ava1-l14-linearMSE.pth` is."""
    torch.manual_seed(seed)
    widths = (embed_dim, 1024, 128, 64, 16, 1)
    state = {}
    for index, (d_in, d_out) in zip((0, 2, 4, 6, 7), zip(widths[:-1], widths[1:], strict=True), strict=True):
        layer = torch.nn.Linear(d_in, d_out)
        state[f"layers.{index}.weight"], state[f"layers.{index}.bias"] = layer.weight.data, layer.bias.data
    file.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, file)
    return file


# a tiny open_clip model config (open_clip's model_cfg keys), ViT-H-14's shape scaled down
TINY_OPEN_CLIP = {"embed_dim": 16,
                  "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
                  "text_cfg": {"context_length": 16, "vocab_size": 0, "width": 32, "heads": 2, "layers": 2}}


def save_tiny_clip_tokenizer(folder: Path) -> tuple[Path, int]:
    """A word-level tokenizer whose end-of-text token has the largest id, as CLIP's BPE vocabulary's
    `<|endoftext|>` does (open_clip pools the text at argmax(ids)); returns (folder, vocabulary size)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["!", "<unk>", "<|startoftext|>", *sorted(set(
        "a photo of the sign that says hello world red green blue black white clock bench cat dog on".split())),
        "<|endoftext|>"]
    vocab = {word: index for index, word in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>",
        special_tokens=[("<|startoftext|>", vocab["<|startoftext|>"]), ("<|endoftext|>", vocab["<|endoftext|>"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=77, pad_token="!",
                                        unk_token="<unk>", bos_token="<|startoftext|>", eos_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    return folder, len(words)


def save_tiny_hps(folder: Path, seed: int = 0) -> tuple[Path, Path, dict]:
    """An HPS-layout checkpoint: {'state_dict': open_clip CLIP weights} of a tiny open_clip config (written
    beside it as open_clip_config.json), random; and a tokenizer folder. Returns (checkpoint, tokenizer, config)."""
    import json

    tokenizer, vocab_size = save_tiny_clip_tokenizer(folder / "processor")
    config = {**TINY_OPEN_CLIP, "text_cfg": {**TINY_OPEN_CLIP["text_cfg"], "vocab_size": vocab_size}}
    vision, text, embed = config["vision_cfg"], config["text_cfg"], config["embed_dim"]
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    def blocks(prefix: str, width: int, layers: int) -> dict[str, torch.Tensor]:
        state = {}
        for i in range(layers):
            p = f"{prefix}transformer.resblocks.{i}."
            state.update({p + "ln_1.weight": 1 + rand(width), p + "ln_1.bias": rand(width),
                          p + "attn.in_proj_weight": rand(3 * width, width), p + "attn.in_proj_bias": rand(3 * width),
                          p + "attn.out_proj.weight": rand(width, width), p + "attn.out_proj.bias": rand(width),
                          p + "ln_2.weight": 1 + rand(width), p + "ln_2.bias": rand(width),
                          p + "mlp.c_fc.weight": rand(4 * width, width), p + "mlp.c_fc.bias": rand(4 * width),
                          p + "mlp.c_proj.weight": rand(width, 4 * width), p + "mlp.c_proj.bias": rand(width)})
        return state

    vw, tw, grid = vision["width"], text["width"], vision["image_size"] // vision["patch_size"]
    state = {"visual.class_embedding": rand(vw), "visual.positional_embedding": rand(grid * grid + 1, vw),
             "visual.conv1.weight": rand(vw, 3, vision["patch_size"], vision["patch_size"]),
             "visual.ln_pre.weight": 1 + rand(vw), "visual.ln_pre.bias": rand(vw),
             **blocks("visual.", vw, vision["layers"]),
             "visual.ln_post.weight": 1 + rand(vw), "visual.ln_post.bias": rand(vw), "visual.proj": rand(vw, embed),
             "token_embedding.weight": rand(vocab_size, tw), "positional_embedding": rand(text["context_length"], tw),
             **blocks("", tw, text["layers"]),
             "ln_final.weight": 1 + rand(tw), "ln_final.bias": rand(tw), "text_projection": rand(tw, embed),
             "logit_scale": torch.tensor(4.6052)}
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": state}, checkpoint)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": config}))
    return checkpoint, tokenizer, config


TINY_MED_CONFIG = {"architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 32, "intermediate_size": 64,
                   "layer_norm_eps": 1e-12, "max_position_embeddings": 40, "model_type": "bert",
                   "num_attention_heads": 2, "num_hidden_layers": 2, "pad_token_id": 0, "type_vocab_size": 2,
                   "vocab_size": 0, "encoder_width": 64, "add_cross_attention": True}  # BLIP's med_config.json keys


def save_tiny_bert_tokenizer(folder: Path) -> tuple[Path, int]:
    """A word-level tokenizer laid out like bert-base-uncased's ([PAD] 0, [CLS] prompt [SEP]); (folder, size)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *sorted(set(
        "a photo of the sign that says hello world red green blue black white clock bench cat dog on".split()))]
    vocab = {word: index for index, word in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=512, pad_token="[PAD]",
                                        unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    tokenizer.save_pretrained(folder)
    return folder, len(words)


def save_tiny_imagereward(folder: Path, seed: int = 0) -> tuple[Path, Path, dict]:
    """ImageReward.pt's layout (blip.visual_encoder.*, blip.text_encoder.*, blip.*_proj, mlp.layers.*) for a tiny
    BLIP (a 64-wide ViT of 8-px patches on 32-px images, a 32-wide BERT with cross-attention), random, with its
    med_config.json beside it and a tokenizer folder. Returns (checkpoint, tokenizer, med_config)."""
    import json

    tokenizer, vocab_size = save_tiny_bert_tokenizer(folder / "tokenizer")
    med = {**TINY_MED_CONFIG, "vocab_size": vocab_size}
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    def linear(name: str, d_out: int, d_in: int) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": rand(d_out, d_in), f"{name}.bias": rand(d_out)}

    def norm(name: str, width: int) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": 1 + rand(width), f"{name}.bias": rand(width)}

    width, patch, image_size, depth = 64, 8, 32, 2
    v = "blip.visual_encoder."
    state = {v + "cls_token": rand(1, 1, width), v + "pos_embed": rand(1, (image_size // patch) ** 2 + 1, width),
             v + "patch_embed.proj.weight": rand(width, 3, patch, patch), v + "patch_embed.proj.bias": rand(width),
             **norm(v + "norm", width)}
    for i in range(depth):
        b = f"{v}blocks.{i}."
        state.update({**norm(b + "norm1", width), **linear(b + "attn.qkv", 3 * width, width),
                      **linear(b + "attn.proj", width, width), **norm(b + "norm2", width),
                      **linear(b + "mlp.fc1", 4 * width, width), **linear(b + "mlp.fc2", width, 4 * width)})
    t, hidden, inner = "blip.text_encoder.", med["hidden_size"], med["intermediate_size"]
    state.update({t + "embeddings.word_embeddings.weight": rand(vocab_size, hidden),
                  t + "embeddings.position_embeddings.weight": rand(med["max_position_embeddings"], hidden),
                  **norm(t + "embeddings.LayerNorm", hidden)})
    for i in range(med["num_hidden_layers"]):
        layer = f"{t}encoder.layer.{i}."
        for attention, d_kv in (("attention", hidden), ("crossattention", width)):
            state.update({**linear(layer + attention + ".self.query", hidden, hidden),
                          **linear(layer + attention + ".self.key", hidden, d_kv),
                          **linear(layer + attention + ".self.value", hidden, d_kv),
                          **linear(layer + attention + ".output.dense", hidden, hidden),
                          **norm(layer + attention + ".output.LayerNorm", hidden)})
        state.update({**linear(layer + "intermediate.dense", inner, hidden),
                      **linear(layer + "output.dense", hidden, inner), **norm(layer + "output.LayerNorm", hidden)})
    state.update({**linear("blip.vision_proj", 16, width), **linear("blip.text_proj", 16, hidden)})
    for index, (d_in, d_out) in zip((0, 2, 4, 6, 7), ((hidden, 1024), (1024, 128), (128, 64), (64, 16), (16, 1)),
                                    strict=True):
        state.update(linear(f"mlp.layers.{index}", d_out, d_in))
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "ImageReward.pt"
    torch.save(state, checkpoint)
    (folder / "med_config.json").write_text(json.dumps(med))
    return checkpoint, tokenizer, med


QWEN_CHAT_TEMPLATE = (  # Qwen2-VL's chat layout for text and image parts, without its tool and video branches
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% else %}{{ part['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_tiny_qwen_vl(folder: Path, seed: int = 0) -> Path:
    """A 2-layer Qwen2.5-VL (32-wide text, 2-block vision tower with 14-px patches) with a word-level tokenizer
    holding Qwen's special tokens and a chat template, saved with save_pretrained."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
               "<|video_pad|>"]
    words = ["<unk>", *special, *sorted(set(
        "yes no Yes No does this image show answer or a photo of the red green blue clock bench cat dog on sign "
        "that says hello world user assistant system ? .".split()))]
    vocab = {word: index for index, word in enumerate(words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<|endoftext|>",
                                        eos_token="<|im_end|>", additional_special_tokens=special[1:])
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(
        text_config={"vocab_size": len(words), "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 2, "num_key_value_heads": 1,
                     "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]},
                     "bos_token_id": None, "eos_token_id": vocab["<|im_end|>"], "pad_token_id": 0},
        vision_config={"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 32,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 56,
                       "fullatt_block_indexes": [1]},
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"], vision_end_token_id=vocab["<|vision_end|>"])
    model = Qwen2_5_VLForConditionalGeneration(config)
    with torch.no_grad():  # larger logits than the init's, so P(yes) varies between images and prompts
        model.lm_head.weight.mul_(20)
    model.save_pretrained(folder)
    return folder
